// JNI entry points for Java/Kotlin apps (see DnnFusionDelegate.java and docs/android.md): they
// create the delegate through the same plugin entry point benchmark_model uses and hand its
// handle to TFLite's Java API (org.tensorflow.lite.Delegate#getNativeHandle). Compiled into the
// Android build of a delegate library only.
#include <jni.h>

#include <string>
#include <vector>

#include "delegate_state.h"
#include "dnnfusion/tflite_abi.h"
#include "report.h"

extern "C" TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, size_t count,
                                                         void (*report_error)(const char*));
extern "C" void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate);

namespace {

std::string g_error;  // the last creation error, for the Java exception
void RememberError(const char* message) { g_error = message; }

std::vector<std::string> Strings(JNIEnv* env, jobjectArray array) {
  std::vector<std::string> out;
  const jsize n = array ? env->GetArrayLength(array) : 0;
  for (jsize i = 0; i < n; ++i) {
    auto text = static_cast<jstring>(env->GetObjectArrayElement(array, i));
    const char* chars = env->GetStringUTFChars(text, nullptr);
    out.emplace_back(chars ? chars : "");
    env->ReleaseStringUTFChars(text, chars);
    env->DeleteLocalRef(text);
  }
  return out;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) JNIEXPORT jlong JNICALL
Java_org_dnnfusion_DnnFusionDelegate_nativeCreate(JNIEnv* env, jclass, jobjectArray keys, jobjectArray values) {
  std::vector<std::string> k = Strings(env, keys), v = Strings(env, values);
  std::vector<char*> kp, vp;
  for (size_t i = 0; i < k.size() && i < v.size(); ++i) {
    kp.push_back(&k[i][0]);
    vp.push_back(&v[i][0]);
  }
  g_error.clear();
  TfLiteDelegate* delegate = tflite_plugin_create_delegate(kp.data(), vp.data(), kp.size(), RememberError);
  if (delegate == nullptr) {
    env->ThrowNew(env->FindClass("java/lang/IllegalArgumentException"), g_error.c_str());
    return 0;
  }
  return reinterpret_cast<jlong>(delegate);
}

extern "C" __attribute__((visibility("default"))) JNIEXPORT jstring JNICALL
Java_org_dnnfusion_DnnFusionDelegate_nativeClaimReport(JNIEnv* env, jclass, jlong handle) {
  auto* delegate = reinterpret_cast<TfLiteDelegate*>(handle);
  auto* state = static_cast<dnnfusion::DelegateState*>(delegate->data_);
  return env->NewStringUTF(dnnfusion::LastReport(*state).c_str());
}

extern "C" __attribute__((visibility("default"))) JNIEXPORT void JNICALL
Java_org_dnnfusion_DnnFusionDelegate_nativeDestroy(JNIEnv*, jclass, jlong handle) {
  tflite_plugin_destroy_delegate(reinterpret_cast<TfLiteDelegate*>(handle));
}
