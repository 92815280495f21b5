// libdnnfusion_jni.so: the JNI side of DnnFusionDelegate.java (docs/android.md). One copy serves
// every dnnfusion library an app ships: it opens a model library by name (lib<name>.so from the
// APK) or by path, and creates the delegate through the two plugin entry points benchmark_model
// uses, which are all a model library exports. ART binds a native method to the first library
// that exports it, so model libraries exporting JNI symbols of their own could not be two in one
// app; the delegate's handle then goes to TFLite's Java API (Delegate#getNativeHandle).
#include <dlfcn.h>
#include <jni.h>

#include <cstddef>
#include <string>
#include <vector>

namespace {

struct TfLiteDelegate;
using Create = TfLiteDelegate* (*)(char**, char**, size_t, void (*)(const char*));
using Destroy = void (*)(TfLiteDelegate*);

// A delegate and the library it came from (kept loaded: TFLite may still hold its kernels).
struct Loaded {
  TfLiteDelegate* delegate = nullptr;
  Destroy destroy = nullptr;
};

thread_local std::string t_error;  // the last creation error, for the Java exception
void RememberError(const char* message) { t_error = message ? message : ""; }

std::string Text(JNIEnv* env, jstring text) {
  const char* chars = text ? env->GetStringUTFChars(text, nullptr) : nullptr;
  std::string out = chars ? chars : "";
  if (chars) env->ReleaseStringUTFChars(text, chars);
  return out;
}

std::vector<std::string> Strings(JNIEnv* env, jobjectArray array) {
  std::vector<std::string> out;
  const jsize n = array ? env->GetArrayLength(array) : 0;
  for (jsize i = 0; i < n; ++i) {
    auto text = static_cast<jstring>(env->GetObjectArrayElement(array, i));
    out.push_back(Text(env, text));
    env->DeleteLocalRef(text);
  }
  return out;
}

// The model library `name` names (lib<name>.so, or a path when it holds a '/') with its entry
// points, or null with the reason in `error`.
void* Open(const std::string& name, Create* create, Destroy* destroy, std::string* error) {
  const std::string file = name.find('/') == std::string::npos ? "lib" + name + ".so" : name;
  void* library = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    *error = why ? why : ("cannot open " + file);
    return nullptr;
  }
  *create = reinterpret_cast<Create>(dlsym(library, "tflite_plugin_create_delegate"));
  *destroy = reinterpret_cast<Destroy>(dlsym(library, "tflite_plugin_destroy_delegate"));
  if (*create == nullptr || *destroy == nullptr) {
    *error = file + " is not a dnnfusion delegate library (no tflite_plugin_create_delegate)";
    return nullptr;
  }
  return library;
}

void Throw(JNIEnv* env, const char* type, const std::string& message) {
  env->ThrowNew(env->FindClass(type), message.c_str());
}

}  // namespace

extern "C" JNIEXPORT jlong JNICALL Java_org_dnnfusion_DnnFusionDelegate_nativeCreate(
    JNIEnv* env, jclass, jstring library, jobjectArray keys, jobjectArray values) {
  Create create = nullptr;
  Destroy destroy = nullptr;
  std::string error;
  if (Open(Text(env, library), &create, &destroy, &error) == nullptr) {
    Throw(env, "java/lang/UnsatisfiedLinkError", error);
    return 0;
  }
  std::vector<std::string> k = Strings(env, keys), v = Strings(env, values);
  std::vector<char*> kp, vp;
  for (size_t i = 0; i < k.size() && i < v.size(); ++i) {
    kp.push_back(&k[i][0]);
    vp.push_back(&v[i][0]);
  }
  t_error.clear();
  TfLiteDelegate* delegate = create(kp.data(), vp.data(), kp.size(), RememberError);
  if (delegate == nullptr) {
    Throw(env, "java/lang/IllegalArgumentException", t_error);
    return 0;
  }
  return reinterpret_cast<jlong>(new Loaded{delegate, destroy});
}

extern "C" JNIEXPORT jlong JNICALL Java_org_dnnfusion_DnnFusionDelegate_nativeDelegate(JNIEnv*, jclass,
                                                                                        jlong loaded) {
  return loaded == 0 ? 0 : reinterpret_cast<jlong>(reinterpret_cast<Loaded*>(loaded)->delegate);
}

extern "C" JNIEXPORT jstring JNICALL Java_org_dnnfusion_DnnFusionDelegate_nativeLoadProblem(JNIEnv* env, jclass,
                                                                                           jstring library) {
  Create create = nullptr;
  Destroy destroy = nullptr;
  std::string error;
  Open(Text(env, library), &create, &destroy, &error);
  return env->NewStringUTF(error.c_str());
}

extern "C" JNIEXPORT void JNICALL Java_org_dnnfusion_DnnFusionDelegate_nativeDestroy(JNIEnv*, jclass,
                                                                                      jlong loaded) {
  auto* entry = reinterpret_cast<Loaded*>(loaded);
  if (entry == nullptr) return;
  entry->destroy(entry->delegate);
  delete entry;
}
