package adpipe.spark;

/**
 * A hash table from an event id's 128-bit digest to the event time (epoch
 * microseconds) of its first copy: open addressing, linear probing,
 * backward-shift deletion, three parallel arrays (24 bytes a slot, about 40
 * an id at its load), so a million ids hold no million objects. Not thread
 * safe: its owner ({@link EventIds}) holds its lock while it uses it.
 */
final class IdTable {
  static final long MISSING = Long.MIN_VALUE;
  private static final double MAX_LOAD = 0.6;

  private long[] hi;
  private long[] lo;
  private long[] values;
  private boolean[] used;
  private int size;

  IdTable() {
    allocate(1 << 10);
  }

  int size() {
    return size;
  }

  private void allocate(int capacity) {
    hi = new long[capacity];
    lo = new long[capacity];
    values = new long[capacity];
    used = new boolean[capacity];
    size = 0;
  }

  private int slot(long h, long l) {
    long mixed = l ^ (h * 0x9E3779B97F4A7C15L);
    return (int) (mixed ^ (mixed >>> 32)) & (used.length - 1);
  }

  /** The first copy's time of the digest {@code (h, l)}, or {@link #MISSING}. */
  long get(long h, long l) {
    int mask = used.length - 1;
    for (int i = slot(h, l); used[i]; i = (i + 1) & mask) {
      if (hi[i] == h && lo[i] == l) {
        return values[i];
      }
    }
    return MISSING;
  }

  /** Adds the digest with its time; a digest already there keeps its time. */
  void putIfAbsent(long h, long l, long value) {
    if (size + 1 > used.length * MAX_LOAD) {
      grow();
    }
    int mask = used.length - 1;
    int i = slot(h, l);
    for (; used[i]; i = (i + 1) & mask) {
      if (hi[i] == h && lo[i] == l) {
        return;
      }
    }
    used[i] = true;
    hi[i] = h;
    lo[i] = l;
    values[i] = value;
    size++;
  }

  /** Removes the digest if present (backward-shift deletion: no tombstones). */
  void remove(long h, long l) {
    int mask = used.length - 1;
    int i = slot(h, l);
    while (used[i] && !(hi[i] == h && lo[i] == l)) {
      i = (i + 1) & mask;
    }
    if (!used[i]) {
      return;
    }
    size--;
    int hole = i;
    for (int j = (hole + 1) & mask; used[j]; j = (j + 1) & mask) {
      int home = slot(hi[j], lo[j]);
      // Move j into the hole when its home is not in (hole, j] (cyclically).
      boolean stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (!stays) {
        hi[hole] = hi[j];
        lo[hole] = lo[j];
        values[hole] = values[j];
        used[hole] = true;
        hole = j;
      }
    }
    used[hole] = false;
  }

  private void grow() {
    long[] oldHi = hi;
    long[] oldLo = lo;
    long[] oldValues = values;
    boolean[] oldUsed = used;
    allocate(oldUsed.length * 2);
    for (int i = 0; i < oldUsed.length; i++) {
      if (oldUsed[i]) {
        putIfAbsent(oldHi[i], oldLo[i], oldValues[i]);
      }
    }
  }
}
