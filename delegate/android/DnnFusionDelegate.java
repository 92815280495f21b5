package org.dnnfusion;

import java.util.Map;
import org.tensorflow.lite.Delegate;

/**
 * A dnnfusion delegate for TFLite's Java API (Kotlin too). The native side is the model's own
 * library, lib{model}_dnnfusion.so for the CPU (lib{model}_dnnfusion_opencl.so,
 * ..._vulkan.so for GPU builds), from the AAR `tflite_tools aar` writes or built from
 * OUT/android/arm64-v8a/ (docs/android.md).
 *
 * <pre>
 * DnnFusionDelegate delegate = DnnFusionDelegate.createOrNull("mobilenet_v2_dnnfusion", options);
 * Interpreter.Options interpreterOptions = new Interpreter.Options();
 * if (delegate != null) interpreterOptions.addDelegate(delegate);  // else: stock TFLite runs it all
 * </pre>
 *
 * <p>Options (all optional): {@code num_threads} (default: the interpreter's), {@code claim}
 * ({@code profitable}, {@code all} or {@code none}), {@code blocks} (comma-separated block names),
 * {@code log_level} ({@code silent}, {@code error}, {@code warning}, {@code info},
 * {@code verbose}; messages go to logcat with tag {@code dnnfusion}), {@code report} (a file that
 * gets one JSON line per claim; {@link #claimReport} returns the last one without a file) and
 * {@code profile} (a file that gets one JSON line per block with its time, when the interpreter
 * is closed).
 */
public final class DnnFusionDelegate implements Delegate, AutoCloseable {
  private long handle;

  /**
   * Loads lib{@code library}.so and creates the delegate.
   *
   * @throws UnsatisfiedLinkError when the app has no such library for this device's ABI (the
   *     delegate is built for arm64-v8a only); {@link #createOrNull} returns null instead
   * @throws IllegalArgumentException with the delegate's reason when an option is bad
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

  /**
   * The delegate, or null where lib{@code library}.so cannot be loaded on this device (another
   * ABI, or the library missing from the APK): run the model without it then. A bad option still
   * throws IllegalArgumentException, as that is a bug in the app, not a property of the device.
   */
  public static DnnFusionDelegate createOrNull(String library, Map<String, String> options) {
    if (!isSupported(library)) {
      return null;
    }
    return new DnnFusionDelegate(library, options);
  }

  /** Whether lib{@code library}.so loads on this device (loading it twice is harmless). */
  public static boolean isSupported(String library) {
    try {
      System.loadLibrary(library);
      return true;
    } catch (UnsatisfiedLinkError | SecurityException e) {
      return false;
    }
  }

  @Override
  public long getNativeHandle() {
    return handle;
  }

  /**
   * What the delegate claimed when an interpreter last applied it, as the JSON line the
   * {@code report} option writes: {@code claimed_blocks}, {@code claimed_nodes} and
   * {@code declined} (each block left to TFLite with the reason). Empty before any interpreter
   * used the delegate.
   */
  public String claimReport() {
    return handle == 0 ? "" : nativeClaimReport(handle);
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

  private static native String nativeClaimReport(long handle);

  private static native void nativeDestroy(long handle);
}
