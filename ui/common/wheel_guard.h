// A mouse wheel over a spin box or a drop-down that the user did not click
// scrolls the panel instead of silently changing the value (Top-k 40 became
// 30 while scrolling). The guarded widgets take focus by click or Tab only
// (Qt::StrongFocus); once focused, the wheel changes them as usual.
#pragma once

class QWidget;

namespace atelier::ui {

// Guards every QAbstractSpinBox and QComboBox under ROOT as it is now.
void guardWheel(QWidget* root);

}  // namespace atelier::ui
