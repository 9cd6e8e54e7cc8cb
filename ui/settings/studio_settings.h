// The studio's settings as one plain value, kept in QSettings (org "atelier",
// app "studio"): what the engine is opened with, how Paint previews and names
// its files, where things live, the theme. needsRestart says which changes
// only take effect when the engine is opened again.
#pragma once

#include <QString>

namespace atelier::ui {

struct StudioSettings {
  // The engine (EngineConfig); a change needs an engine restart.
  int threads = 0;             // 0: one per core
  int maxBatch = 32;           // sequences decoded together per step
  int maxWaitMs = 100;         // the dynamic batching window
  int kvMemoryMiB = 1024;      // KV cache budget per loaded model
  int modelMemoryMiB = 8192;   // loaded models kept until their bytes pass this
  QString kvType = QStringLiteral("f16");  // "f16", "f32", "q8_0", "bf16" or "fp8" (kv_type_name)
  QString device = QStringLiteral("auto");  // --device: "auto", "cpu", "cuda:N" (EngineConfig::devices)
  QString storeDir;            // "" = the data folder
  // Paint, at once.
  int previewEverySteps = 1;   // show a preview every N denoising steps
  QString previewDecoder;      // a TAESD decoder file ("" = the fast latent projection)
  QString outputFolder;        // "" = DATA/outputs
  QString fileNaming = QStringLiteral("atelier-{date}-{time}-{seed}");  // {date} {time} {seed} {model}
  QString theme = QStringLiteral("dark");
  // The API server (shown only where one exists).
  bool apiEnabled = false;
  QString apiAddress = QStringLiteral("127.0.0.1:8080");
  QString apiKey;

  static StudioSettings load();  // QSettings, defaults where unset
  void save() const;
  // True when going from THIS to NEXT needs the engine opened again.
  bool needsRestart(const StudioSettings& next) const;
  bool operator==(const StudioSettings&) const = default;
};

}  // namespace atelier::ui
