package org.dnnfusion;

import java.io.BufferedReader;
import java.io.File;
import java.io.FileReader;
import java.io.IOException;
import java.util.HashMap;
import java.util.Map;
import org.tensorflow.lite.Delegate;

/**
 * A dnnfusion delegate for TFLite's Java API (Kotlin too). One class and one JNI library
 * (libdnnfusion_jni.so) serve every model library an app ships: lib{model}_dnnfusion.so for the
 * CPU, lib{model}_dnnfusion_opencl.so, ..._vulkan.so for GPU builds, from the AAR `tflite_tools
 * aar` writes (docs/android.md). Each delegate runs the kernels of the library it names.
 *
 * <pre>
 * Map&lt;String, String&gt; options = new DnnFusionDelegate.Options().claim("all").build();
 * DnnFusionDelegate delegate = DnnFusionDelegate.createOrNull("mobilenet_v2_dnnfusion", options);
 * Interpreter.Options interpreterOptions = new Interpreter.Options();
 * if (delegate != null) interpreterOptions.addDelegate(delegate);  // else: stock TFLite runs it all
 * </pre>
 *
 * <p>Options (all optional; {@link Options} builds them): {@code num_threads} (default: the
 * interpreter's), {@code claim} ({@code profitable}, {@code all} or {@code none}), {@code blocks}
 * (comma-separated block names), {@code log_level} ({@code silent}, {@code error}, {@code
 * warning}, {@code info}, {@code verbose}; messages go to logcat with tag {@code dnnfusion}),
 * {@code report} (a file that gets one JSON line per claim; {@link #claimReport} returns the last
 * one), {@code profile} (a file that gets one JSON line per block with its time, when the
 * interpreter is closed) and {@code require_device} ({@code true}: creation fails on a device
 * that cannot run the kernels; {@link #deviceProblem} asks without creating one to keep).
 */
public final class DnnFusionDelegate implements Delegate, AutoCloseable {
  private static final String JNI_LIBRARY = "dnnfusion_jni";

  private long loaded;  // the native side's record of the delegate and its library
  private long handle;  // the TfLiteDelegate*
  private final File report;
  private final boolean ownReport;  // a temporary file of ours, deleted on close

  /** Typed delegate options, as {@code GpuDelegate.Options} gives them. */
  public static final class Options {
    private final Map<String, String> values = new HashMap<>();

    /** Threads the kernels run on; -1 or unset: the interpreter's. */
    public Options numThreads(int threads) {
      values.put("num_threads", Integer.toString(threads));
      return this;
    }

    /** Which blocks the delegate claims: {@code profitable} (its default), {@code all}, {@code none}. */
    public Options claim(String policy) {
      values.put("claim", policy);
      return this;
    }

    /** Claim only these blocks (by name, as report.md lists them). */
    public Options blocks(String... names) {
      values.put("blocks", String.join(",", names));
      return this;
    }

    /** {@code silent}, {@code error}, {@code warning} (default), {@code info} or {@code verbose}. */
    public Options logLevel(String level) {
      values.put("log_level", level);
      return this;
    }

    /** A file that gets one JSON line per block with its time when the interpreter is closed. */
    public Options profile(String path) {
      values.put("profile", path);
      return this;
    }

    /** Fail creation on a device that cannot run the kernels (CPU features, the GPU API). */
    public Options requireDevice(boolean required) {
      values.put("require_device", Boolean.toString(required));
      return this;
    }

    /** The options as the delegate takes them. */
    public Map<String, String> build() {
      return new HashMap<>(values);
    }
  }

  /**
   * Creates the delegate of lib{@code library}.so (or of the library at a path holding '/').
   *
   * @throws UnsatisfiedLinkError when the app has no such library for this device's ABI (the
   *     delegate is built for arm64-v8a only); {@link #createOrNull} returns null instead
   * @throws IllegalArgumentException with the delegate's reason when an option is bad, or with
   *     {@code require_device} when this device cannot run the kernels
   */
  public DnnFusionDelegate(String library, Map<String, String> options) {
    System.loadLibrary(JNI_LIBRARY);
    Map<String, String> all = new HashMap<>(options);
    File file = null;
    boolean own = false;
    if (!all.containsKey("report")) {  // claimReport reads the claims from here
      try {
        file = File.createTempFile("dnnfusion-claims", ".jsonl");
        own = true;
        all.put("report", file.getPath());
      } catch (IOException | SecurityException e) {
        file = null;
      }
    } else {
      file = new File(all.get("report"));
    }
    report = file;
    ownReport = own;
    String[] keys = all.keySet().toArray(new String[0]);
    String[] values = new String[keys.length];
    for (int i = 0; i < keys.length; ++i) {
      values[i] = all.get(keys[i]);
    }
    try {
      loaded = nativeCreate(library, keys, values);
    } catch (RuntimeException | UnsatisfiedLinkError e) {
      if (ownReport) report.delete();
      throw e;
    }
    handle = nativeDelegate(loaded);
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

  /** Whether lib{@code library}.so loads on this device (see {@link #deviceProblem} for more). */
  public static boolean isSupported(String library) {
    try {
      System.loadLibrary(JNI_LIBRARY);
      return nativeLoadProblem(library).isEmpty();
    } catch (UnsatisfiedLinkError | SecurityException e) {
      return false;
    }
  }

  /**
   * Why this device cannot run lib{@code library}.so's kernels (the library missing, a CPU without
   * the dot-product instructions an arm64-android build uses, no OpenCL or Vulkan driver for a GPU
   * build), or "" when it can: checked by creating the delegate with {@code require_device}.
   */
  public static String deviceProblem(String library) {
    if (!isSupported(library)) {
      return "lib" + library + ".so cannot be loaded on this device";
    }
    Map<String, String> options = new HashMap<>();
    options.put("require_device", "true");
    options.put("log_level", "silent");
    try (DnnFusionDelegate probe = new DnnFusionDelegate(library, options)) {
      return "";
    } catch (IllegalArgumentException e) {
      return e.getMessage();
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
    if (report == null) {
      return "";
    }
    String last = "";
    try (BufferedReader reader = new BufferedReader(new FileReader(report))) {
      for (String line = reader.readLine(); line != null; line = reader.readLine()) {
        if (!line.isEmpty()) last = line;
      }
    } catch (IOException e) {
      return "";
    }
    return last;
  }

  /** Destroys the delegate; close every Interpreter that uses it first. */
  @Override
  public void close() {
    if (loaded != 0) {
      nativeDestroy(loaded);
      loaded = 0;
      handle = 0;
      if (ownReport) report.delete();
    }
  }

  private static native long nativeCreate(String library, String[] keys, String[] values);

  private static native long nativeDelegate(long loaded);

  private static native String nativeLoadProblem(String library);

  private static native void nativeDestroy(long loaded);
}
