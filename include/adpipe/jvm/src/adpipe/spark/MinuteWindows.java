package adpipe.spark;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessorWithInitialState;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The second operator: keyed by (event minute, bucket of the ad), it owns
 * the minute's windows of its ads, so each window's full counts are in one
 * place. Its input is {@link EventIds}' counted events, summed per (ad,
 * minute), and the rows that operator only names (late, malformed,
 * conflicting, progress, counters), which come under negative keys and pass
 * through.
 *
 * <p>In every batch it has state (a timer set to the next batch brings it back
 * even without input) it settles its windows against the batch's watermark:
 *
 * <ul>
 *   <li>while the window is open ({@code end > watermark}) counts only add up;
 *   <li>once it is closed, each ad whose counts changed since it was last emitted is emitted, its
 *       revision one higher (a window's first emission is revision 0), with its full counts: once per
 *       window and batch;
 *   <li>once {@code end + lateness <= watermark} the minute's state is dropped (no event can reach it
 *       any more: {@link EventIds} sends such events to the late topic).
 * </ul>
 *
 * <p><b>State</b>: one value per key, the ads' counts, last emitted revision and whether they changed
 * since (read and written whole: a batch touches a few keys, never a call per event).
 */
public final class MinuteWindows extends StatefulProcessorWithInitialState<Long, Row, Row, Row> {
  private static final long serialVersionUID = 1L;
  private static final int IMPRESSIONS = 0;
  private static final int CLICKS = 1;
  private static final int REVISION = 2;
  private static final int CHANGED = 3;

  private final long latenessMs;
  private transient ValueState<byte[]> windows;

  public MinuteWindows(long latenessMs) {
    this.latenessMs = latenessMs;
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    windows = getHandle().getValueState("windows", Encoders.BINARY(), TTLConfig.NONE());
  }

  /**
   * An upgrade's initial state (a new checkpoint's first batch only): an
   * open window's counts (group key, ad, impressions, clicks), not emitted yet.
   */
  @Override
  public void handleInitialState(Long group, Row initial, TimerValues timerValues) {
    Map<String, long[]> ads = load();
    long[] ad = ads.computeIfAbsent(initial.getString(1), a -> new long[] {0, 0, -1, 0});
    ad[IMPRESSIONS] += initial.getLong(2);
    ad[CLICKS] += initial.getLong(3);
    ad[CHANGED] = 1;
    windows.update(encode(ads));
    nextBatchTimer(timerValues);
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(
      Long group, scala.collection.Iterator<Row> rows, TimerValues timerValues) {
    if (group < 0) { // named rows: passed on as they are
      List<Row> passed = new ArrayList<>();
      while (rows.hasNext()) {
        passed.add(rows.next());
      }
      return CollectionConverters.asScala(passed.iterator());
    }
    Map<String, long[]> ads = load();
    Timestamp batchTime = null;
    while (rows.hasNext()) {
      Row row = rows.next();
      batchTime = row.getTimestamp(StreamOperators.OUT_BATCH_TIME);
      long[] ad = ads.computeIfAbsent(row.getString(StreamOperators.OUT_AD_ID), a -> new long[] {0, 0, -1, 0});
      ad[IMPRESSIONS] += row.getLong(StreamOperators.OUT_IMPRESSIONS);
      ad[CLICKS] += row.getLong(StreamOperators.OUT_CLICKS);
      ad[CHANGED] = 1;
    }
    return CollectionConverters.asScala(settle(group, ads, true, timerValues, batchTime).iterator());
  }

  @Override
  public scala.collection.Iterator<Row> handleExpiredTimer(
      Long group, TimerValues timerValues, ExpiredTimerInfo expiredTimerInfo) {
    if (!windows.exists()) {
      return CollectionConverters.asScala(new ArrayList<Row>().iterator());
    }
    Timestamp batchTime = new Timestamp(timerValues.getCurrentWatermarkInMs() + 1);
    return CollectionConverters.asScala(settle(group, load(), false, timerValues, batchTime).iterator());
  }

  private List<Row> settle(
      long group, Map<String, long[]> ads, boolean changed, TimerValues timerValues, Timestamp batchTime) {
    long watermark = StreamOperators.watermark();
    long minute = Math.floorDiv(group, StreamOperators.AD_BUCKETS);
    long start = minute * StreamOperators.MINUTE_MS;
    long end = start + StreamOperators.MINUTE_MS;
    List<Row> out = new ArrayList<>();
    if (end <= watermark) {
      for (Map.Entry<String, long[]> entry : ads.entrySet()) {
        long[] ad = entry.getValue();
        if (ad[CHANGED] == 0) {
          continue;
        }
        ad[REVISION]++;
        ad[CHANGED] = 0;
        changed = true;
        Out window = new Out(StreamOperators.KIND_AGGREGATE, group, watermark, batchTime);
        window.adId = entry.getKey();
        window.windowStartMs = start;
        window.impressions = ad[IMPRESSIONS];
        window.clicks = ad[CLICKS];
        window.revision = (int) ad[REVISION];
        out.add(window.row());
      }
    }
    if (end + latenessMs <= watermark) {
      windows.clear();
      return out;
    }
    if (changed) {
      windows.update(encode(ads));
    }
    nextBatchTimer(timerValues);
    return out;
  }

  /**
   * A timer that fires in the next batch (Spark's watermark rises by one a
   * batch), unless one is set already: the timer firing now is still listed
   * while its handler runs.
   */
  private void nextBatchTimer(TimerValues timerValues) {
    long next = timerValues.getCurrentWatermarkInMs() + 1;
    scala.collection.Iterator<Object> timers = getHandle().listTimers();
    while (timers.hasNext()) {
      if ((Long) timers.next() == next) {
        return;
      }
    }
    getHandle().registerTimer(next);
  }

  private Map<String, long[]> load() {
    Map<String, long[]> ads = new LinkedHashMap<>();
    if (!windows.exists()) {
      return ads;
    }
    ByteBuffer blob = ByteBuffer.wrap(windows.get());
    int count = blob.getInt();
    for (int i = 0; i < count; i++) {
      char[] name = new char[blob.getInt()];
      for (int c = 0; c < name.length; c++) {
        name[c] = blob.getChar();
      }
      long[] ad = {blob.getLong(), blob.getLong(), blob.getInt(), blob.get()};
      ads.put(new String(name), ad);
    }
    return ads;
  }

  private static byte[] encode(Map<String, long[]> ads) {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream(64 + ads.size() * 48);
    try (DataOutputStream out = new DataOutputStream(bytes)) {
      out.writeInt(ads.size());
      for (Map.Entry<String, long[]> entry : ads.entrySet()) {
        // As UTF-16 units: any Java text, lone surrogates included, reads back the same.
        String name = entry.getKey();
        long[] ad = entry.getValue();
        out.writeInt(name.length());
        out.writeChars(name);
        out.writeLong(ad[IMPRESSIONS]);
        out.writeLong(ad[CLICKS]);
        out.writeInt((int) ad[REVISION]);
        out.writeByte((int) ad[CHANGED]);
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return bytes.toByteArray();
  }
}
