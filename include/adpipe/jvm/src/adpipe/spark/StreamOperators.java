package adpipe.spark;

import static org.apache.spark.sql.functions.coalesce;
import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.lit;
import static org.apache.spark.sql.functions.not;
import static org.apache.spark.sql.functions.octet_length;
import static org.apache.spark.sql.functions.udf;
import static org.apache.spark.sql.functions.unix_micros;
import static org.apache.spark.sql.functions.unix_millis;
import static org.apache.spark.sql.functions.when;

import java.sql.Timestamp;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF0;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * The aggregation stream job's two stateful operators, as one step over
 * parsed raw events (adpipe.raw_events): {@link EventIds}, keyed by a bucket
 * of the event id, decides for every record whether it is malformed, a
 * repeat, a conflicting copy, late, or counted, and sums the counted ones per
 * (ad, minute); {@link MinuteWindows}, keyed by (minute, bucket of the ad),
 * owns each window's counts, emits a window when the watermark passes its end
 * and revises it while late events come within the allowed lateness.
 *
 * <p>Two clocks. The <b>event-time watermark</b> that closes windows is the
 * driver's (adpipe.stream.watermark: the slowest partition with records
 * waiting); it reaches both operators as the local property {@link
 * #WATERMARK_PROPERTY} of the batch's job, and every output row carries the
 * one it used, which the driver checks. <b>Spark's own watermark</b> runs on
 * the batch id ({@link #BATCH_TIME}): strictly rising, so Spark never takes a
 * row for late and drops it, and it rises once per data batch, so Spark runs
 * one batch without data after the last one (the windows that the last
 * data closes are emitted then) and {@link MinuteWindows}'s timers, set to
 * the next batch, let it look at its windows in every batch while they are
 * open or revisable.
 */
public final class StreamOperators {
  /** The local property holding the batch's event-time watermark (epoch ms). */
  public static final String WATERMARK_PROPERTY = "adpipe.watermark_ms";
  /** Spark's own: the id of the micro-batch a job belongs to. */
  static final String BATCH_ID_PROPERTY = "streaming.sql.batchId";
  /** Keys of {@link EventIds}: fixed for a checkpoint's life (the state is keyed by them). */
  public static final int ID_BUCKETS = 16;
  /** Ad buckets per minute in {@link MinuteWindows}' keys: fixed for a checkpoint's life too. */
  public static final int AD_BUCKETS = 8;
  public static final long MINUTE_MS = 60_000L;

  /** A malformed record whose key and value together are at most this many bytes carries them through. */
  public static final int INLINE_RECORD_BYTES = 4096;
  /** ... while a task's carried records stay within this many bytes together. */
  public static final long INLINE_BUDGET_BYTES = 4L << 20;

  public static final String KIND_PARTIAL = "partial";
  public static final String KIND_AGGREGATE = "aggregate";
  public static final String KIND_LATE = "late";
  public static final String KIND_MALFORMED = "malformed";
  public static final String KIND_CONFLICT = "conflict";
  public static final String KIND_PROGRESS = "progress";
  public static final String KIND_COUNTERS = "counters";

  /** What {@link EventIds} reads: the parsed rows, projected (see {@link #operatorInput}). */
  static final StructType INPUT =
      new StructType()
          .add("digest", DataTypes.BinaryType)
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType)
          .add("record_ms", DataTypes.LongType)
          .add("reject_reason", DataTypes.StringType)
          .add("event_id", DataTypes.StringType)
          .add("ad_id", DataTypes.StringType)
          .add("event_type", DataTypes.StringType)
          .add("event_us", DataTypes.LongType)
          .add("inline", DataTypes.BooleanType)
          .add("key", DataTypes.BinaryType)
          .add("value", DataTypes.BinaryType)
          .add("batch_time", DataTypes.TimestampType);

  static final int IN_DIGEST = 0;
  static final int IN_PARTITION = 1;
  static final int IN_OFFSET = 2;
  static final int IN_RECORD_MS = 3;
  static final int IN_REASON = 4;
  static final int IN_EVENT_ID = 5;
  static final int IN_AD_ID = 6;
  static final int IN_EVENT_TYPE = 7;
  static final int IN_EVENT_US = 8;
  static final int IN_INLINE = 9;
  static final int IN_KEY = 10;
  static final int IN_VALUE = 11;
  static final int IN_BATCH_TIME = 12;

  /** What both operators write (see {@link Out}); the driver reads {@link MinuteWindows}' rows. */
  public static final StructType OUTPUT =
      new StructType()
          .add("kind", DataTypes.StringType)
          .add("group_key", DataTypes.LongType)
          .add("ad_id", DataTypes.StringType)
          .add("window_start_ms", DataTypes.LongType)
          .add("impressions", DataTypes.LongType)
          .add("clicks", DataTypes.LongType)
          .add("revision", DataTypes.IntegerType)
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType)
          .add("reject_reason", DataTypes.StringType)
          .add("event_id", DataTypes.StringType)
          .add("event_us", DataTypes.LongType)
          .add("first_event_us", DataTypes.LongType)
          .add("inline", DataTypes.BooleanType)
          .add("key", DataTypes.BinaryType)
          .add("value", DataTypes.BinaryType)
          .add("progress_ms", DataTypes.LongType)
          .add("records", DataTypes.LongType)
          .add("repeats", DataTypes.LongType)
          .add("late_repeats", DataTypes.LongType)
          .add("watermark_ms", DataTypes.LongType)
          .add("batch_time", DataTypes.TimestampType);

  static final int OUT_KIND = 0;
  static final int OUT_GROUP = 1;
  static final int OUT_AD_ID = 2;
  static final int OUT_IMPRESSIONS = 4;
  static final int OUT_CLICKS = 5;
  static final int OUT_BATCH_TIME = 21;

  /** Spark's watermark column: the batch id, as milliseconds after the epoch, plus one. */
  public static final class BatchTime implements UDF0<Timestamp> {
    private static final long serialVersionUID = 1L;

    @Override
    public Timestamp call() {
      return new Timestamp(batchId() + 1);
    }
  }

  private static final UserDefinedFunction BATCH_TIME =
      udf(new BatchTime(), DataTypes.TimestampType).asNondeterministic();

  /** An event id's 16-byte BLAKE2b digest ({@link Blake2b128}), which keys the dedupe state. */
  public static final class EventDigest implements UDF1<String, byte[]> {
    private static final long serialVersionUID = 1L;

    @Override
    public byte[] call(String eventId) {
      return eventId == null ? null : Blake2b128.digestBytes(eventId);
    }
  }

  private static final UserDefinedFunction EVENT_DIGEST = udf(new EventDigest(), DataTypes.BinaryType);

  private StreamOperators() {}

  static long batchId() {
    return Long.parseLong(property(BATCH_ID_PROPERTY));
  }

  /** The event-time watermark of the running batch (the driver sets it for the batch's job). */
  static long watermark() {
    return Long.parseLong(property(WATERMARK_PROPERTY));
  }

  private static String property(String name) {
    TaskContext task = TaskContext.get();
    String value = task == null ? null : task.getLocalProperty(name);
    if (value == null) {
      throw new IllegalStateException(
          "the local property " + name + " is not set: the stream job's operators run only in the batch "
              + "jobs of adpipe's stream driver, which sets it");
    }
    return value;
  }

  /** The minute (epoch minutes) of an event time in microseconds. */
  static long minuteOf(long eventUs) {
    return Math.floorDiv(eventUs, MINUTE_MS * 1000);
  }

  /**
   * {@link EventIds}' key of a record: a bucket of its event id's digest (so
   * the ids of a checkpoint written before digests keyed it map to buckets
   * too), or for a malformed record one of its partition.
   */
  static int idBucket(Row row) {
    if (row.isNullAt(IN_DIGEST)) {
      return Math.floorMod(row.getInt(IN_PARTITION), ID_BUCKETS);
    }
    return idBucket((byte[]) row.get(IN_DIGEST));
  }

  public static int idBucket(byte[] digest) {
    return (digest[0] & 0xff) % ID_BUCKETS;
  }

  /** A digest's bytes as {@link IdTable}'s two longs (little endian, as {@link Blake2b128} gives them). */
  public static long[] digestLongs(byte[] digest) {
    java.nio.ByteBuffer bytes = java.nio.ByteBuffer.wrap(digest).order(java.nio.ByteOrder.LITTLE_ENDIAN);
    return new long[] {bytes.getLong(0), bytes.getLong(8)};
  }

  static int adBucket(String adId) {
    return Math.floorMod(adId.hashCode(), AD_BUCKETS);
  }

  /** {@link MinuteWindows}' key of an ad's window; never negative. */
  static long windowGroup(long minute, String adId) {
    return minute * AD_BUCKETS + adBucket(adId);
  }

  /** {@link MinuteWindows}' key of rows it only passes on (exceptions, progress): negative. */
  static long passGroup(int idBucket) {
    return -1L - idBucket;
  }

  /** The parsed rows as {@link EventIds} reads them, with Spark's watermark on the batch id. */
  static Dataset<Row> operatorInput(Dataset<Row> parsed) {
    Column valid = col("reject_reason").isNull();
    Column recordBytes =
        coalesce(octet_length(col("key")), lit(0)).plus(coalesce(octet_length(col("value")), lit(0)));
    Column inline = not(valid).and(recordBytes.leq(INLINE_RECORD_BYTES));
    return parsed
        .withColumn("batch_time", BATCH_TIME.apply())
        .withWatermark("batch_time", "0 seconds")
        .select(
            when(valid, EVENT_DIGEST.apply(col("event_id"))).alias("digest"),
            col("partition").cast("int").alias("partition"),
            col("offset").cast("long").alias("offset"),
            unix_millis(col("timestamp")).alias("record_ms"),
            col("reject_reason"),
            when(valid, col("event_id")).alias("event_id"),
            when(valid, col("ad_id")).alias("ad_id"),
            when(valid, col("event_type")).alias("event_type"),
            when(valid, unix_micros(col("event_time"))).alias("event_us"),
            inline.alias("inline"),
            when(inline, col("key")).alias("key"),
            when(inline, col("value")).alias("value"),
            col("batch_time"));
  }

  /** An initial state of {@link EventIds}: a segment of ids per bucket (an upgrade's). */
  public static final StructType INITIAL_IDS =
      new StructType()
          .add("id_bucket", DataTypes.IntegerType)
          .add("segment", DataTypes.LongType)
          .add("blob", DataTypes.BinaryType);

  /** An initial state of {@link MinuteWindows}: an open window's counts (an upgrade's). */
  public static final StructType INITIAL_WINDOWS =
      new StructType()
          .add("window_minute", DataTypes.LongType)
          .add("ad_id", DataTypes.StringType)
          .add("impressions", DataTypes.LongType)
          .add("clicks", DataTypes.LongType);

  /**
   * The job's query from parsed raw events to the rows its driver collects
   * ({@link #OUTPUT}): windows emitted or revised, late, malformed and
   * conflicting records by position, each partition's progress, counters.
   * The two initial states ({@link #INITIAL_IDS}, {@link #INITIAL_WINDOWS};
   * empty but for an upgrade) are used by Spark in a new checkpoint's first
   * batch only.
   *
   * @param latenessMs how long after its close a window can still be revised (event time)
   * @param retentionMs how long after its minute an event id is remembered (event time)
   */
  public static Dataset<Row> apply(
      Dataset<Row> parsed,
      long latenessMs,
      long retentionMs,
      Dataset<Row> initialIds,
      Dataset<Row> initialWindows) {
    Dataset<Row> ids =
        operatorInput(parsed)
            .groupByKey((MapFunction<Row, Integer>) StreamOperators::idBucket, Encoders.INT())
            .transformWithState(
                new EventIds(latenessMs, retentionMs),
                OutputMode.Append(),
                initialIds.groupByKey((MapFunction<Row, Integer>) row -> row.getInt(0), Encoders.INT()),
                "batch_time",
                Encoders.row(OUTPUT),
                Encoders.row(INITIAL_IDS),
                Encoders.row(OUTPUT),
                Encoders.row(INITIAL_IDS));
    return ids.groupByKey((MapFunction<Row, Long>) row -> row.getLong(OUT_GROUP), Encoders.LONG())
        .transformWithState(
            new MinuteWindows(latenessMs),
            TimeMode.EventTime(),
            OutputMode.Append(),
            initialWindows.groupByKey(
                (MapFunction<Row, Long>) row -> windowGroup(row.getLong(0), row.getString(1)), Encoders.LONG()),
            Encoders.row(OUTPUT),
            Encoders.row(INITIAL_WINDOWS));
  }

  /**
   * The query without initial states: every start but an upgraded
   * checkpoint's first (an empty initial state would still cost each batch
   * its plan's extra branches).
   */
  public static Dataset<Row> apply(Dataset<Row> parsed, long latenessMs, long retentionMs) {
    Dataset<Row> ids =
        operatorInput(parsed)
            .groupByKey((MapFunction<Row, Integer>) StreamOperators::idBucket, Encoders.INT())
            .transformWithState(
                new EventIds(latenessMs, retentionMs), "batch_time", OutputMode.Append(), Encoders.row(OUTPUT));
    return ids.groupByKey((MapFunction<Row, Long>) row -> row.getLong(OUT_GROUP), Encoders.LONG())
        .transformWithState(
            new MinuteWindows(latenessMs), TimeMode.EventTime(), OutputMode.Append(), Encoders.row(OUTPUT));
  }
}
