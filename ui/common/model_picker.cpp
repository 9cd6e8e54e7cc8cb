#include "common/model_picker.h"

namespace atelier::ui {

ModelPicker::ModelPicker(bridge::EngineBridge* bridge, QString kind, QWidget* parent)
    : QComboBox(parent), kind_(std::move(kind)) {
  setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  setMinimumContentsLength(18);
  setToolTip(tr("The model that runs the job: a store version (name@version, its channels in brackets) or a model file"));
  setPlaceholderText(tr("no %1 model installed").arg(kind_));
  connect(bridge, &bridge::EngineBridge::modelsScanned, this, &ModelPicker::fill);
  connect(this, &QComboBox::currentIndexChanged, this, [this] { emit referenceChanged(reference()); });
}

QString ModelPicker::reference() const { return currentData().toString(); }

void ModelPicker::setReference(const QString& reference) {
  if (reference.isEmpty()) return;
  int i = findData(reference);
  if (i < 0) {
    // A name without version ("stories260k") matches its newest listed version.
    for (int k = 0; k < count() && i < 0; ++k)
      if (itemData(k).toString().section('@', 0, 0) == reference) i = k;
  }
  if (i < 0) {
    addItem(reference, reference);
    i = count() - 1;
  }
  setCurrentIndex(i);
}

void ModelPicker::fill(const QVector<bridge::ModelChoice>& models) {
  const QString keep = reference().isEmpty() ? preferred_ : reference();
  {
    // One referenceChanged for the refill, not one per item.
    const QSignalBlocker block(this);
    clear();
    for (const bridge::ModelChoice& m : models) {
      if (m.kind != kind_) continue;
      addItem(m.label, m.reference);
      setItemData(count() - 1, m.detail, Qt::ToolTipRole);
    }
    if (!keep.isEmpty()) setReference(keep);
    else if (count() > 0) setCurrentIndex(0);
  }
  emit referenceChanged(reference());
}

}  // namespace atelier::ui
