package org.dnnfusion;

import java.util.Map;
import org.tensorflow.lite.Delegate;

/**
 * A dnnfusion delegate for TFLite's Java API (Kotlin too). The native side is the model's own
 * library, lib<model>_dnnfusion.so, built from OUT/android/arm64-v8a/ (docs/android.md).
 *
 * <pre>
 * try (DnnFusionDelegate delegate = new DnnFusionDelegate("mobilenet_v2_dnnfusion", Map.of("num_threads", "2"));
 *      Interpreter interpreter = new Interpreter(model, new Interpreter.Options().addDelegate(delegate))) {
 *   interpreter.run(input, output);
 * }
 * </pre>
 */
public final class DnnFusionDelegate implements Delegate, AutoCloseable {
  private long handle;

  /**
   * Loads lib{@code library}.so and creates the delegate with options (num_threads, claim, blocks,
   * log_level, report). Throws IllegalArgumentException with the reason when an option is bad.
   */
  public DnnFusionDelegate(String library, Map<String, String> options) {
    System.loadLibrary(library);
    String[] keys = options.keySet().toArray(new String[0]);
    String[] values = new String[keys.length];
    for (int i = 0; i < keys.length; ++i) {
      values[i] = options.get(keys[i]);
    }
    handle = nativeCreate(keys, values);
  }

  @Override
  public long getNativeHandle() {
    return handle;
  }

  /** Destroys the delegate; close every Interpreter that uses it first. */
  @Override
  public void close() {
    if (handle != 0) {
      nativeDestroy(handle);
      handle = 0;
    }
  }

  private static native long nativeCreate(String[] keys, String[] values);

  private static native void nativeDestroy(long handle);
}
