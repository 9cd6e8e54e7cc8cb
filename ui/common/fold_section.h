// FoldSection: a titled section whose body folds away (a tool button with an
// arrow over it), so a parameter panel keeps its everyday settings in view at
// the default window size and the less-used ones one click away. Folded, the
// body is hidden (its controls stay in the tab order's reach once opened);
// open() lets a panel unfold it when its settings start to matter.
#pragma once

#include <QWidget>

class QToolButton;

namespace atelier::ui {

class FoldSection : public QWidget {
  Q_OBJECT

 public:
  FoldSection(const QString& title, QWidget* parent = nullptr);
  QWidget* body() const { return body_; }  // lay the section's controls out on it
  bool isOpen() const;
  void setOpen(bool open);
  QToolButton* header() const { return header_; }

 signals:
  void toggled(bool open);

 private:
  QToolButton* header_;
  QWidget* body_;
};

}  // namespace atelier::ui
