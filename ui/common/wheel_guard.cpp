#include "common/wheel_guard.h"

#include <QAbstractSpinBox>
#include <QApplication>
#include <QComboBox>
#include <QEvent>
#include <QObject>
#include <QWidget>

namespace atelier::ui {

namespace {
class WheelGuard : public QObject {
 public:
  using QObject::QObject;
  bool eventFilter(QObject* watched, QEvent* event) override {
    auto* w = qobject_cast<QWidget*>(watched);
    if (event->type() != QEvent::Wheel || !w || w->hasFocus()) return false;
    // Not for this widget: the panel around it scrolls instead.
    if (QWidget* parent = w->parentWidget()) QApplication::sendEvent(parent, event);
    return true;
  }
};
}  // namespace

void guardWheel(QWidget* root) {
  auto* guard = new WheelGuard(root);
  for (QWidget* w : root->findChildren<QWidget*>()) {
    if (!qobject_cast<QAbstractSpinBox*>(w) && !qobject_cast<QComboBox*>(w)) continue;
    w->setFocusPolicy(Qt::StrongFocus);
    w->installEventFilter(guard);
  }
}

}  // namespace atelier::ui
