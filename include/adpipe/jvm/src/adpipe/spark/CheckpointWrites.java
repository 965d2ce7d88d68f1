package adpipe.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager$;

/**
 * Writes and deletes the stream driver's own files in a query's checkpoint
 * (its per-batch progress, adpipe.stream.watermark) through the checkpoint
 * file manager Spark's own offset and commit logs use: on any file system
 * Spark checkpoints to, a reader sees a file whole or not at all.
 */
public final class CheckpointWrites {
  private CheckpointWrites() {}

  private static CheckpointFileManager manager(Path folder, Configuration conf) {
    return CheckpointFileManager$.MODULE$.create(folder, conf);
  }

  /** Writes {@code text} to {@code root/relative}, replacing what was there, atomically. */
  public static void write(String root, String relative, String text, Configuration conf) throws IOException {
    Path path = new Path(new Path(root), relative);
    CheckpointFileManager files = manager(path.getParent(), conf);
    files.mkdirs(path.getParent());
    CheckpointFileManager.CancellableFSDataOutputStream out = files.createAtomic(path, true);
    try {
      out.write(text.getBytes(StandardCharsets.UTF_8));
      out.close();
    } catch (IOException | RuntimeException e) {
      out.cancel();
      throw e;
    }
  }

  /** Deletes {@code root/relative} if it is there. */
  public static void delete(String root, String relative, Configuration conf) throws IOException {
    Path path = new Path(new Path(root), relative);
    manager(path.getParent(), conf).delete(path);
  }
}
