package adpipe.spark;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The fast path of adpipe.raw_events: reads a Kafka record's bytes once and,
 * when they hold an event in the contract's own shape, returns its fields as
 * text; null for every other record, which then takes the variant route.
 *
 * <p>The shape: one flat JSON object whose members come in the contract's
 * order (event_id, ad_id, an optional campaign_id, event_type, event_time),
 * string values without escapes or control characters (so the bytes between
 * two quotes are the value), non-empty ids, an event_time that is a
 * non-empty string or at most 15 digits of milliseconds without a leading
 * zero, JSON whitespace only, nothing after the object, valid UTF-8. Which
 * event types are known is for the caller to check (the "kind" is returned
 * for any string). Returns (kind, event_id, ad_id, campaign_id, event_type,
 * event_time) with kind STRING or BIGINT, the JSON type of event_time.
 *
 * <p>The values are views on the record's own bytes (no decoding, no copy):
 * Spark hands a UDF a copy of a binary column, never a buffer it reuses.
 */
public final class CanonicalEvent implements UDF1<byte[], Row> {
  private static final long serialVersionUID = 1L;
  private static final UTF8String STRING = UTF8String.fromString("STRING");
  private static final UTF8String BIGINT = UTF8String.fromString("BIGINT");
  private static final byte[] EVENT_ID = key("event_id");
  private static final byte[] AD_ID = key("ad_id");
  private static final byte[] CAMPAIGN_ID = key("campaign_id");
  private static final byte[] EVENT_TYPE = key("event_type");
  private static final byte[] EVENT_TIME = key("event_time");
  private static final int MAX_TIME_DIGITS = 15;

  private static byte[] key(String name) {
    return ("\"" + name + "\"").getBytes(java.nio.charset.StandardCharsets.US_ASCII);
  }

  @Override
  public Row call(byte[] bytes) {
    if (bytes == null) {
      return null;
    }
    for (byte b : bytes) {
      if (b < 0) {
        // Not ASCII: valid UTF-8 or no fast path (a cast would hide it as U+FFFD).
        if (!UTF8String.fromBytes(bytes).isValid()) {
          return null;
        }
        break;
      }
    }
    return new Reader(bytes).event();
  }

  /** One pass over one record; every method returns false (or null) at the first byte out of shape. */
  private static final class Reader {
    private final byte[] b;
    private int at;
    private int valueStart;
    private int valueEnd;

    Reader(byte[] bytes) {
      b = bytes;
    }

    Row event() {
      if (!(spaces() && literal((byte) '{') && member(EVENT_ID) && text(true))) {
        return null;
      }
      UTF8String eventId = value();
      if (!(comma() && member(AD_ID) && text(true))) {
        return null;
      }
      UTF8String adId = value();
      if (!comma()) {
        return null;
      }
      UTF8String campaignId = null;
      if (startsWith(CAMPAIGN_ID)) {
        if (!(member(CAMPAIGN_ID) && text(false) && comma())) {
          return null;
        }
        campaignId = value();
      }
      if (!(member(EVENT_TYPE) && text(true))) {
        return null;
      }
      UTF8String eventType = value();
      if (!(comma() && member(EVENT_TIME))) {
        return null;
      }
      UTF8String kind;
      if (at < b.length && b[at] == '"') {
        if (!text(true)) {
          return null;
        }
        kind = STRING;
      } else if (millis()) {
        kind = BIGINT;
      } else {
        return null;
      }
      UTF8String eventTime = value();
      if (!(spaces() && literal((byte) '}') && spaces() && at == b.length)) {
        return null;
      }
      return RowFactory.create(kind, eventId, adId, campaignId, eventType, eventTime);
    }

    private UTF8String value() {
      return UTF8String.fromBytes(b, valueStart, valueEnd - valueStart);
    }

    private boolean spaces() {
      while (at < b.length && (b[at] == ' ' || b[at] == '\t' || b[at] == '\n' || b[at] == '\r')) {
        at++;
      }
      return true;
    }

    private boolean literal(byte expected) {
      if (at < b.length && b[at] == expected) {
        at++;
        return true;
      }
      return false;
    }

    private boolean comma() {
      return spaces() && literal((byte) ',') && spaces();
    }

    private boolean startsWith(byte[] key) {
      if (b.length - at < key.length) {
        return false;
      }
      for (int i = 0; i < key.length; i++) {
        if (b[at + i] != key[i]) {
          return false;
        }
      }
      return true;
    }

    /** A key and its colon, with the whitespace around them. */
    private boolean member(byte[] key) {
      if (!startsWith(key)) {
        return false;
      }
      at += key.length;
      return spaces() && literal((byte) ':') && spaces();
    }

    /** A string without escapes, quotes or control characters. */
    private boolean text(boolean nonEmpty) {
      if (!literal((byte) '"')) {
        return false;
      }
      valueStart = at;
      while (at < b.length && b[at] != '"') {
        int c = b[at] & 0xff;
        if (c == '\\' || c < 0x20) {
          return false;
        }
        at++;
      }
      if (at == b.length || (nonEmpty && at == valueStart)) {
        return false;
      }
      valueEnd = at++;
      return true;
    }

    /** 0, or 1 to 15 digits without a leading zero. */
    private boolean millis() {
      valueStart = at;
      while (at < b.length && b[at] >= '0' && b[at] <= '9') {
        at++;
      }
      int digits = at - valueStart;
      valueEnd = at;
      return digits >= 1 && digits <= MAX_TIME_DIGITS && (digits == 1 || b[valueStart] != '0');
    }
  }
}
