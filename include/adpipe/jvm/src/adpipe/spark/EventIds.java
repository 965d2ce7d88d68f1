package adpipe.spark;

import java.nio.ByteBuffer;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessorWithInitialState;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The first operator: keyed by a bucket of the event id (malformed records
 * by one of their partition), it reads a batch's records of its bucket in
 * (record timestamp, partition, offset) order and decides each:
 *
 * <ul>
 *   <li>malformed: named by position (a small one with its key and value);
 *   <li>a copy of an event id it knows with the same event time: a repeat, only counted;
 *   <li>a copy with another event time: a conflicting duplicate, named by position (the first copy
 *       read wins, whatever its time);
 *   <li>a new event whose window's allowed lateness has passed ({@code end + lateness <= watermark}):
 *       late, named by position;
 *   <li>any other new event: counted, in one row per (ad, minute) of the bucket's batch, which goes to
 *       the ad's {@link MinuteWindows} key.
 * </ul>
 *
 * <p>It also writes, per Kafka partition, the highest event time of the valid records it read and how
 * many records it read (the driver's watermark needs them).
 *
 * <p><b>State</b>: the ids it has seen, as segments, one per batch that saw new ids (map key: the
 * batch id; value: the ids' 128-bit BLAKE2b digests and first event times, and the segment's latest
 * window end), and the batch that last wrote the bucket. A segment is deleted once the watermark has
 * passed its latest window end plus the retention. A batch writes one segment, never rewrites the
 * others. Lookups go to an in-memory table of the bucket's ids, kept per JVM between batches: it is used
 * only when it was last brought up to date by the very batch that last wrote the bucket's state (so a
 * retried task, a replayed batch or a bucket that ran elsewhere meanwhile rebuilds it from the state).
 */
public final class EventIds extends StatefulProcessorWithInitialState<Integer, Row, Row, Row> {
  private static final long serialVersionUID = 1L;
  /** The event time of an id whose first copy's time is not known (ids carried over from an earlier version). */
  public static final long UNKNOWN_TIME = Long.MIN_VALUE + 1;
  /** The batch that last wrote a bucket whose state came from an initial state (an upgrade). */
  private static final long INITIAL = -2L;
  private static final int ENTRY_BYTES = 24;
  private static final int HEADER_BYTES = 12;
  private static final Comparator<Row> READ_ORDER =
      Comparator.<Row>comparingLong(r -> r.getLong(StreamOperators.IN_RECORD_MS))
          .thenComparingInt(r -> r.getInt(StreamOperators.IN_PARTITION))
          .thenComparingLong(r -> r.getLong(StreamOperators.IN_OFFSET));

  /** The in-memory tables, by query id and bucket. */
  private static final ConcurrentHashMap<String, Index> INDEXES = new ConcurrentHashMap<>();

  private final long latenessMs;
  private final long retentionMs;
  private transient MapState<Long, byte[]> segments;
  private transient ValueState<Long> lastBatch;
  private transient long inlineSpent;

  public EventIds(long latenessMs, long retentionMs) {
    this.latenessMs = latenessMs;
    this.retentionMs = retentionMs;
  }

  /** A bucket's ids in memory, and which batch they are up to date with. */
  static final class Index {
    long batch = Long.MIN_VALUE;
    IdTable table = new IdTable();
    /** segment (batch id) -> its latest window end (epoch ms). */
    TreeMap<Long, Long> segments = new TreeMap<>();
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    segments = getHandle().getMapState("id_segments", Encoders.LONG(), Encoders.BINARY(), TTLConfig.NONE());
    lastBatch = getHandle().getValueState("last_batch", Encoders.LONG(), TTLConfig.NONE());
  }

  /**
   * An upgrade's initial state (applied by Spark in a new checkpoint's first
   * batch only): a segment of ids (``segment`` id, its blob as this class
   * writes them), kept as it is; the bucket's table is rebuilt from the state
   * at its first input.
   */
  @Override
  public void handleInitialState(Integer bucket, Row initial, TimerValues timerValues) {
    segments.updateValue(initial.getLong(1), (byte[]) initial.get(2));
    lastBatch.update(INITIAL);
  }

  /**
   * An earlier version's ids of one event minute (its state held them as
   * concatenated 16-byte digests) as this version's segments, one per id
   * bucket (null where the bucket has none): their first event time is not
   * known ({@link #UNKNOWN_TIME}), they expire with the minute.
   */
  public static byte[][] upgradeSegments(byte[] digests, long minute) {
    List<List<long[]>> byBucket = new ArrayList<>();
    for (int b = 0; b < StreamOperators.ID_BUCKETS; b++) {
      byBucket.add(new ArrayList<>());
    }
    for (int at = 0; at + 16 <= digests.length; at += 16) {
      byte[] digest = java.util.Arrays.copyOfRange(digests, at, at + 16);
      long[] longs = StreamOperators.digestLongs(digest);
      byBucket.get(StreamOperators.idBucket(digest)).add(new long[] {longs[0], longs[1], UNKNOWN_TIME});
    }
    byte[][] blobs = new byte[StreamOperators.ID_BUCKETS][];
    for (int b = 0; b < blobs.length; b++) {
      if (!byBucket.get(b).isEmpty()) {
        blobs[b] = segmentBlob(byBucket.get(b).toArray(new long[0][]), (minute + 1) * StreamOperators.MINUTE_MS);
      }
    }
    return blobs;
  }

  /** A segment blob of ids (digest as two longs, first event time), all expiring with {@code latestEnd}. */
  static byte[] segmentBlob(long[][] ids, long latestEnd) {
    ByteBuffer blob = ByteBuffer.allocate(HEADER_BYTES + ENTRY_BYTES * ids.length);
    blob.putInt(ids.length).putLong(latestEnd);
    for (long[] id : ids) {
      blob.putLong(id[0]).putLong(id[1]).putLong(id[2]);
    }
    return blob.array();
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(
      Integer bucket, scala.collection.Iterator<Row> rows, TimerValues timerValues) {
    long watermark = StreamOperators.watermark();
    long batch = getHandle().getQueryInfo().getBatchId();
    List<Row> input = new ArrayList<>();
    while (rows.hasNext()) {
      input.add(rows.next());
    }
    input.sort(READ_ORDER);
    Timestamp batchTime = input.get(0).getTimestamp(StreamOperators.IN_BATCH_TIME);
    String name = getHandle().getQueryInfo().getQueryId() + "/" + bucket;
    Index index = INDEXES.computeIfAbsent(name, k -> new Index());
    List<Row> out;
    synchronized (index) {
      Long written = lastBatch.exists() ? lastBatch.get() : null;
      long stateBatch = written == null ? -1L : written;
      if (index.batch != stateBatch) {
        rebuild(index);
      }
      // Marked before any change: a task that fails half way leaves the table marked for a rebuild.
      index.batch = batch;
      expire(index, watermark);
      out = decide(bucket, input, index, watermark, batch, batchTime);
      lastBatch.update(batch);
    }
    return CollectionConverters.asScala(out.iterator());
  }

  private void rebuild(Index index) {
    index.table = new IdTable();
    index.segments = new TreeMap<>();
    scala.collection.Iterator<Tuple2<Long, byte[]>> all = segments.iterator();
    while (all.hasNext()) {
      Tuple2<Long, byte[]> segment = all.next();
      ByteBuffer blob = ByteBuffer.wrap(segment._2());
      int count = blob.getInt();
      index.segments.put(segment._1(), blob.getLong());
      for (int i = 0; i < count; i++) {
        index.table.putIfAbsent(blob.getLong(), blob.getLong(), blob.getLong());
      }
    }
  }

  private void expire(Index index, long watermark) {
    Iterator<Map.Entry<Long, Long>> it = index.segments.entrySet().iterator();
    while (it.hasNext()) {
      Map.Entry<Long, Long> segment = it.next();
      if (segment.getValue() + retentionMs > watermark) {
        continue;
      }
      ByteBuffer blob = ByteBuffer.wrap(segments.getValue(segment.getKey()));
      int count = blob.getInt();
      blob.getLong();
      for (int i = 0; i < count; i++) {
        index.table.remove(blob.getLong(), blob.getLong());
        blob.getLong();
      }
      segments.removeKey(segment.getKey());
      it.remove();
    }
  }

  private List<Row> decide(
      int bucket, List<Row> input, Index index, long watermark, long batch, Timestamp batchTime) {
    long pass = StreamOperators.passGroup(bucket);
    List<Row> out = new ArrayList<>();
    // (minute, ad) -> {impressions, clicks}, in first-seen order
    Map<Long, Map<String, long[]>> counts = new LinkedHashMap<>();
    Map<Integer, long[]> progress = new HashMap<>(); // partition -> {highest event ms, records}
    ByteBuffer segment = ByteBuffer.allocate(HEADER_BYTES + ENTRY_BYTES * input.size());
    segment.position(HEADER_BYTES);
    int added = 0;
    long latestEnd = Long.MIN_VALUE;
    long repeats = 0;
    long lateRepeats = 0;
    for (Row row : input) {
      int partition = row.getInt(StreamOperators.IN_PARTITION);
      long[] seen = progress.computeIfAbsent(partition, p -> new long[] {Long.MIN_VALUE, 0});
      seen[1]++;
      if (!row.isNullAt(StreamOperators.IN_REASON)) {
        out.add(malformed(row, pass, watermark, batchTime));
        continue;
      }
      long eventUs = row.getLong(StreamOperators.IN_EVENT_US);
      seen[0] = Math.max(seen[0], Math.floorDiv(eventUs, 1000));
      long minute = StreamOperators.minuteOf(eventUs);
      long windowEnd = (minute + 1) * StreamOperators.MINUTE_MS;
      long[] digest = StreamOperators.digestLongs((byte[]) row.get(StreamOperators.IN_DIGEST));
      long first = index.table.get(digest[0], digest[1]);
      if (first != IdTable.MISSING) {
        if (first == eventUs || first == UNKNOWN_TIME) {
          repeats++;
          if (windowEnd + latenessMs <= watermark) {
            lateRepeats++;
          }
        } else {
          Out conflict = named(StreamOperators.KIND_CONFLICT, row, pass, watermark, batchTime);
          conflict.firstEventUs = first;
          out.add(conflict.row());
        }
        continue;
      }
      index.table.putIfAbsent(digest[0], digest[1], eventUs);
      segment.putLong(digest[0]).putLong(digest[1]).putLong(eventUs);
      added++;
      latestEnd = Math.max(latestEnd, windowEnd);
      if (windowEnd + latenessMs <= watermark) {
        out.add(named(StreamOperators.KIND_LATE, row, pass, watermark, batchTime).row());
        continue;
      }
      long[] total =
          counts.computeIfAbsent(minute, m -> new LinkedHashMap<>())
              .computeIfAbsent(row.getString(StreamOperators.IN_AD_ID), a -> new long[2]);
      total["click".equals(row.getString(StreamOperators.IN_EVENT_TYPE)) ? 1 : 0]++;
    }
    if (added > 0) {
      segment.putInt(0, added).putLong(4, latestEnd);
      byte[] blob = new byte[HEADER_BYTES + ENTRY_BYTES * added];
      System.arraycopy(segment.array(), 0, blob, 0, blob.length);
      segments.updateValue(batch, blob);
      index.segments.put(batch, latestEnd);
    }
    for (Map.Entry<Long, Map<String, long[]>> minute : counts.entrySet()) {
      for (Map.Entry<String, long[]> ad : minute.getValue().entrySet()) {
        Out partial =
            new Out(
                StreamOperators.KIND_PARTIAL,
                StreamOperators.windowGroup(minute.getKey(), ad.getKey()),
                watermark,
                batchTime);
        partial.adId = ad.getKey();
        partial.windowStartMs = minute.getKey() * StreamOperators.MINUTE_MS;
        partial.impressions = ad.getValue()[0];
        partial.clicks = ad.getValue()[1];
        out.add(partial.row());
      }
    }
    for (Map.Entry<Integer, long[]> partition : progress.entrySet()) {
      Out seen = new Out(StreamOperators.KIND_PROGRESS, pass, watermark, batchTime);
      seen.partition = partition.getKey();
      seen.progressMs = partition.getValue()[0] == Long.MIN_VALUE ? null : partition.getValue()[0];
      seen.records = partition.getValue()[1];
      out.add(seen.row());
    }
    if (repeats > 0) {
      Out counters = new Out(StreamOperators.KIND_COUNTERS, pass, watermark, batchTime);
      counters.repeats = repeats;
      counters.lateRepeats = lateRepeats;
      out.add(counters.row());
    }
    return out;
  }

  /** A row named by its position, with the event's fields. */
  private static Out named(String kind, Row row, long group, long watermark, Timestamp batchTime) {
    Out named = new Out(kind, group, watermark, batchTime);
    named.partition = row.getInt(StreamOperators.IN_PARTITION);
    named.offset = row.getLong(StreamOperators.IN_OFFSET);
    named.eventId = row.getString(StreamOperators.IN_EVENT_ID);
    named.adId = row.getString(StreamOperators.IN_AD_ID);
    named.eventUs = row.getLong(StreamOperators.IN_EVENT_US);
    named.inline = false;
    return named;
  }

  /** A malformed row: its reason, and its key and value while the task's budget for them lasts. */
  private Row malformed(Row row, long group, long watermark, Timestamp batchTime) {
    Out bad = new Out(StreamOperators.KIND_MALFORMED, group, watermark, batchTime);
    bad.partition = row.getInt(StreamOperators.IN_PARTITION);
    bad.offset = row.getLong(StreamOperators.IN_OFFSET);
    bad.rejectReason = row.getString(StreamOperators.IN_REASON);
    bad.inline = false;
    if (!row.isNullAt(StreamOperators.IN_INLINE) && row.getBoolean(StreamOperators.IN_INLINE)) {
      byte[] key = row.isNullAt(StreamOperators.IN_KEY) ? null : (byte[]) row.get(StreamOperators.IN_KEY);
      byte[] value = row.isNullAt(StreamOperators.IN_VALUE) ? null : (byte[]) row.get(StreamOperators.IN_VALUE);
      long size = (key == null ? 0 : key.length) + (value == null ? 0 : value.length);
      if (inlineSpent + size <= StreamOperators.INLINE_BUDGET_BYTES) {
        inlineSpent += size;
        bad.inline = true;
        bad.key = key;
        bad.value = value;
      }
    }
    return bad.row();
  }
}
