package adpipe.spark;

/**
 * BLAKE2b with a 16-byte digest (RFC 7693, no key): the event id's digest
 * the stream job's dedupe state holds, equal to Python's
 * {@code hashlib.blake2b(data, digest_size=16)} (tests hold the two to each
 * other). A cryptographic digest, so no input can be made to collide with
 * another event's id on purpose; 128 bits, so none does by chance.
 *
 * <p>Returned as two longs (the digest's first and last 8 bytes, little
 * endian), which the id table stores without allocating.
 */
public final class Blake2b128 {
  private static final long[] IV = {
    0x6a09e667f3bcc908L, 0xbb67ae8584caa73bL, 0x3c6ef372fe94f82bL, 0xa54ff53a5f1d36f1L,
    0x510e527fade682d1L, 0x9b05688c2b3e6c1fL, 0x1f83d9abfb41bd6bL, 0x5be0cd19137e2179L,
  };
  private static final byte[][] SIGMA = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
  };
  private static final int OUT_BYTES = 16;

  private Blake2b128() {}

  /** The digest of {@code data}: {first 8 bytes, last 8 bytes}, each little endian. */
  public static long[] digest(byte[] data) {
    long[] h = IV.clone();
    h[0] ^= 0x01010000L ^ OUT_BYTES;
    long[] m = new long[16];
    long[] v = new long[16];
    int blocks = Math.max(1, (data.length + 127) / 128);
    for (int block = 0; block < blocks; block++) {
      int start = block * 128;
      java.util.Arrays.fill(m, 0L);
      int end = Math.min(data.length, start + 128);
      for (int i = start; i < end; i++) {
        m[(i - start) >>> 3] |= (data[i] & 0xffL) << (8 * ((i - start) & 7));
      }
      boolean last = block == blocks - 1;
      compress(h, m, v, last ? data.length : start + 128, last);
    }
    return new long[] {h[0], h[1]};
  }

  /**
   * The digest of a text's UTF-8 bytes, a lone surrogate written as its own
   * three bytes (Python's {@code "surrogatepass"}) so that no two texts share
   * an encoding (Java's encoder would write both {@code "\ud800"} and
   * {@code "?"} as {@code ?}).
   */
  public static long[] digest(String text) {
    return digest(utf8(text));
  }

  static byte[] utf8(String text) {
    byte[] out = new byte[text.length() * 3];
    int n = 0;
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      if (c < 0x80) {
        out[n++] = (byte) c;
      } else if (c < 0x800) {
        out[n++] = (byte) (0xc0 | (c >>> 6));
        out[n++] = (byte) (0x80 | (c & 0x3f));
      } else if (Character.isHighSurrogate(c)
          && i + 1 < text.length()
          && Character.isLowSurrogate(text.charAt(i + 1))) {
        int cp = Character.toCodePoint(c, text.charAt(++i));
        out[n++] = (byte) (0xf0 | (cp >>> 18));
        out[n++] = (byte) (0x80 | ((cp >>> 12) & 0x3f));
        out[n++] = (byte) (0x80 | ((cp >>> 6) & 0x3f));
        out[n++] = (byte) (0x80 | (cp & 0x3f));
      } else {
        out[n++] = (byte) (0xe0 | (c >>> 12));
        out[n++] = (byte) (0x80 | ((c >>> 6) & 0x3f));
        out[n++] = (byte) (0x80 | (c & 0x3f));
      }
    }
    return java.util.Arrays.copyOf(out, n);
  }

  /** The digest as its 16 bytes (Python's {@code digest()}), for tests and state blobs. */
  public static byte[] digestBytes(String text) {
    long[] d = digest(text);
    byte[] out = new byte[OUT_BYTES];
    for (int i = 0; i < 8; i++) {
      out[i] = (byte) (d[0] >>> (8 * i));
      out[8 + i] = (byte) (d[1] >>> (8 * i));
    }
    return out;
  }

  private static void compress(long[] h, long[] m, long[] v, long counter, boolean last) {
    System.arraycopy(h, 0, v, 0, 8);
    System.arraycopy(IV, 0, v, 8, 8);
    v[12] ^= counter; // the high word of the 128-bit counter stays 0: inputs are far below 2^64 bytes
    if (last) {
      v[14] = ~v[14];
    }
    for (int round = 0; round < 12; round++) {
      byte[] s = SIGMA[round % 10];
      mix(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
      mix(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
      mix(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
      mix(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
      mix(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
      mix(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
      mix(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
      mix(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) {
      h[i] ^= v[i] ^ v[i + 8];
    }
  }

  private static void mix(long[] v, int a, int b, int c, int d, long x, long y) {
    v[a] = v[a] + v[b] + x;
    v[d] = Long.rotateRight(v[d] ^ v[a], 32);
    v[c] = v[c] + v[d];
    v[b] = Long.rotateRight(v[b] ^ v[c], 24);
    v[a] = v[a] + v[b] + y;
    v[d] = Long.rotateRight(v[d] ^ v[a], 16);
    v[c] = v[c] + v[d];
    v[b] = Long.rotateRight(v[b] ^ v[c], 63);
  }
}
