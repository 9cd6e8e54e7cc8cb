#include "settings/studio_settings.h"

#include <QSettings>

namespace atelier::ui {

StudioSettings StudioSettings::load() {
  QSettings q;
  StudioSettings d, s;
  s.threads = q.value(QStringLiteral("engine/threads"), d.threads).toInt();
  s.maxBatch = q.value(QStringLiteral("engine/maxBatch"), d.maxBatch).toInt();
  s.maxWaitMs = q.value(QStringLiteral("engine/maxWaitMs"), d.maxWaitMs).toInt();
  s.kvMemoryMiB = q.value(QStringLiteral("engine/kvMemoryMiB"), d.kvMemoryMiB).toInt();
  s.modelMemoryMiB = q.value(QStringLiteral("engine/modelMemoryMiB"), d.modelMemoryMiB).toInt();
  s.kvType = q.value(QStringLiteral("engine/kvType"), d.kvType).toString();
  s.device = q.value(QStringLiteral("engine/device"), d.device).toString();
  s.storeDir = q.value(QStringLiteral("engine/storeDir"), d.storeDir).toString();
  s.previewEverySteps = q.value(QStringLiteral("paint/previewEverySteps"), d.previewEverySteps).toInt();
  s.previewDecoder = q.value(QStringLiteral("paint/previewDecoder"), d.previewDecoder).toString();
  s.outputFolder = q.value(QStringLiteral("studio/outputFolder"), d.outputFolder).toString();
  s.fileNaming = q.value(QStringLiteral("paint/fileNaming"), d.fileNaming).toString();
  s.theme = q.value(QStringLiteral("studio/theme"), d.theme).toString();
  s.apiEnabled = q.value(QStringLiteral("api/enabled"), d.apiEnabled).toBool();
  s.apiAddress = q.value(QStringLiteral("api/address"), d.apiAddress).toString();
  s.apiKey = q.value(QStringLiteral("api/key"), d.apiKey).toString();
  return s;
}

void StudioSettings::save() const {
  QSettings q;
  q.setValue(QStringLiteral("engine/threads"), threads);
  q.setValue(QStringLiteral("engine/maxBatch"), maxBatch);
  q.setValue(QStringLiteral("engine/maxWaitMs"), maxWaitMs);
  q.setValue(QStringLiteral("engine/kvMemoryMiB"), kvMemoryMiB);
  q.setValue(QStringLiteral("engine/modelMemoryMiB"), modelMemoryMiB);
  q.setValue(QStringLiteral("engine/kvType"), kvType);
  q.setValue(QStringLiteral("engine/device"), device);
  q.setValue(QStringLiteral("engine/storeDir"), storeDir);
  q.setValue(QStringLiteral("paint/previewEverySteps"), previewEverySteps);
  q.setValue(QStringLiteral("paint/previewDecoder"), previewDecoder);
  if (!outputFolder.isEmpty()) q.setValue(QStringLiteral("studio/outputFolder"), outputFolder);
  q.setValue(QStringLiteral("paint/fileNaming"), fileNaming);
  q.setValue(QStringLiteral("studio/theme"), theme);
  q.setValue(QStringLiteral("api/enabled"), apiEnabled);
  q.setValue(QStringLiteral("api/address"), apiAddress);
  q.setValue(QStringLiteral("api/key"), apiKey);
  q.sync();
}

bool StudioSettings::needsRestart(const StudioSettings& n) const {
  return threads != n.threads || maxBatch != n.maxBatch || maxWaitMs != n.maxWaitMs || kvMemoryMiB != n.kvMemoryMiB ||
         modelMemoryMiB != n.modelMemoryMiB || kvType != n.kvType || storeDir != n.storeDir ||
         device != n.device;
}

}  // namespace atelier::ui
