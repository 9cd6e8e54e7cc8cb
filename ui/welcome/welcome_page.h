// The first start: with an empty store, a page offers to install the default
// models (a text and an image model) from the catalog's addresses or from a
// mirror folder chosen here, shows the install's progress, and says when
// it is done (the window then opens Write).
#pragma once

#include <QWidget>

#include "bridge/store_worker.h"

class QLabel;
class QLineEdit;
class QProgressBar;
class QPushButton;
class QRadioButton;

namespace atelier::ui {

class WelcomePage : public QWidget {
  Q_OBJECT

 public:
  explicit WelcomePage(bridge::StoreWorker* store, QWidget* parent = nullptr);
  static QStringList defaultModels();  // what "Install" installs
  void setMirror(const QString& folder);  // selects "from a mirror folder"
  QString message() const;

 public slots:
  void install();

 signals:
  void installed();  // every default model is in the store
  void skipped();

 private:
  bridge::StoreWorker* store_;
  QRadioButton* fromCatalog_;
  QRadioButton* fromMirror_;
  QLineEdit* mirror_;
  QPushButton* install_;
  QPushButton* cancel_;
  QPushButton* skip_;
  QProgressBar* progress_;
  QLabel* status_;
  bool running_ = false;
};

}  // namespace atelier::ui
