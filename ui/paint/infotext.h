// AUTOMATIC1111's infotext (the PNG "parameters" text that A1111, Forge and
// Atelier write), parsed into plain values; and the mapping of its sampler
// and schedule names onto the engine's.
//
//   a red fox, (masterpiece:1.2)          <- prompt (any number of lines)
//   Negative prompt: blurry               <- negative prompt (any number of lines)
//   Steps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 1, Size: 512x512, Model hash: 6ce0161689, Model: v1-5
//
// The last line is the parameters line when it holds at least three
// "Key: value" pairs (A1111's rule); values may be quoted ("a, b" with \" escapes).
#pragma once

#include <QList>
#include <QPair>
#include <QString>
#include <QStringList>

#include <optional>

namespace atelier::ui {

struct Infotext {
  QString prompt;
  QString negativePrompt;
  std::optional<int> steps;
  QString sampler;       // as written: "Euler a", "DPM++ 2M Karras"
  QString scheduleType;  // as written: "Karras", "Automatic" ("" when absent)
  std::optional<double> cfgScale;
  std::optional<quint64> seed;
  std::optional<int> width, height;  // from "Size: WxH"
  QString model;
  QString modelHash;
  std::optional<double> denoisingStrength;
  QString rng;  // "RNG": "CPU", "NV" ("" = A1111's default, the GPU generator)
  // Every other key, in the order written (values unquoted): "Clip skip",
  // "Hires upscale", "Version", ...
  QList<QPair<QString, QString>> extra;
  bool hasParameters = false;  // a parameters line was found
  QString value(const QString& key) const;  // an extra key's value, "" when absent
};

Infotext parseInfotext(const QString& text);

// An A1111 sampler name (or the engine's own: "euler_a") as the engine's
// sampler and, when the name implies one ("DPM++ 2M Karras" in A1111 before
// 1.9), its schedule ("karras"; "" when the name says nothing).
struct SamplerChoice {
  QString sampler;    // euler, euler_a, heun, dpmpp_2m, ddim, lcm
  QString scheduler;  // "", "discrete" or "karras"
};
std::optional<SamplerChoice> mapSampler(const QString& name);
// A1111's "Schedule type" as the engine's scheduler: Karras -> karras,
// Automatic/Uniform -> discrete; std::nullopt when the engine has no such schedule.
std::optional<QString> mapScheduleType(const QString& name);
// The engine's sampler names, in the order the Paint panel lists them.
QStringList engineSamplers();

// A PNG's text chunk KEY ("parameters", "atelier"): tEXt, zTXt or iTXt,
// anywhere in the file, read by walking the chunks (no pixels decoded).
// QImageReader::text() is no substitute: it folds the value's newlines into
// spaces, which loses the prompt/parameters line structure. "" when absent;
// *error says why when the file is not a readable PNG.
QString readPngText(const QString& path, const QString& key, QString* error = nullptr);

}  // namespace atelier::ui
