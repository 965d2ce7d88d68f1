package adpipe.spark;

import java.sql.Timestamp;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;

/** One row of {@link StreamOperators#OUTPUT}, filled by name; unset fields are null. */
final class Out {
  String kind;
  Long group;
  String adId;
  Long windowStartMs;
  Long impressions;
  Long clicks;
  Integer revision;
  Integer partition;
  Long offset;
  String rejectReason;
  String eventId;
  Long eventUs;
  Long firstEventUs;
  Boolean inline;
  byte[] key;
  byte[] value;
  Long progressMs;
  Long records;
  Long repeats;
  Long lateRepeats;
  long watermarkMs;
  Timestamp batchTime;

  Out(String kind, long group, long watermarkMs, Timestamp batchTime) {
    this.kind = kind;
    this.group = group;
    this.watermarkMs = watermarkMs;
    this.batchTime = batchTime;
  }

  Row row() {
    return RowFactory.create(
        kind, group, adId, windowStartMs, impressions, clicks, revision, partition, offset, rejectReason, eventId,
        eventUs, firstEventUs, inline, key, value, progressMs, records, repeats, lateRepeats, watermarkMs,
        batchTime);
  }
}
