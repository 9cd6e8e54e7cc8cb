// The gallery: the output folder's PNGs as thumbnails, newest first, decoded
// off the UI thread (only the ones the view shows). Click or Enter views an
// image at full size (arrow keys move between images); a context menu reuses
// its parameters or seed, sends it to img2img, copies it or its prompt,
// reveals it, or deletes it (moved to the folder's .trash/, undoable with Ctrl+Z).
#pragma once

#include <QAbstractListModel>
#include <QDialog>
#include <QImage>
#include <QPixmap>
#include <QStringList>
#include <QThreadPool>
#include <QWidget>

#include <memory>

class QAction;
class QLabel;
class QListView;
class QPlainTextEdit;
class QUndoStack;

namespace atelier::ui {

// One row per PNG: DecorationRole is its thumbnail (requested when first
// asked for), ToolTipRole its name and prompt.
class GalleryModel : public QAbstractListModel {
  Q_OBJECT

 public:
  enum Role { PathRole = Qt::UserRole + 1, ParametersRole, ThumbnailReadyRole };
  explicit GalleryModel(QObject* parent = nullptr);
  ~GalleryModel() override;

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;

  void setPaths(const QStringList& paths);  // replaces the list
  void insertPaths(int row, const QStringList& paths);  // skips paths already listed (they move there)
  void removePath(const QString& path);
  int rowOf(const QString& path) const;
  QString pathAt(int row) const;
  QStringList paths() const;
  void setThumbnailSize(int pixels);
  int thumbnailSize() const { return thumbSize_; }

 private:
  struct Item {
    QString path;
    QPixmap thumb;
    QString parameters;
    bool requested = false, ready = false;
  };
  void request(const std::shared_ptr<Item>& item) const;
  QList<std::shared_ptr<Item>> items_;
  int thumbSize_ = 128;
  QPixmap placeholder_;
  mutable QThreadPool pool_;
};

// A picture at full size, with its parameters; Left/Right (and Up/Down,
// Home/End) move through the gallery, Esc closes.
class ImageViewer : public QDialog {
  Q_OBJECT

 public:
  explicit ImageViewer(QWidget* parent = nullptr);
  // Shows PATH (image INDEX of COUNT), decoding it off the UI thread.
  void showImage(const QString& path, int index, int count);
  QString path() const { return path_; }
  QImage image() const { return image_; }

 signals:
  void move(int delta);      // -1 previous, +1 next
  void moveTo(int index);    // Home (0), End (-1: the last)

 protected:
  void keyPressEvent(QKeyEvent* event) override;

 private:
  class Picture;
  Picture* picture_;
  QPlainTextEdit* parameters_;
  QString path_;
  QImage image_;
  quint64 generation_ = 0;
};

class GalleryView : public QWidget {
  Q_OBJECT

 public:
  explicit GalleryView(QWidget* parent = nullptr);
  ~GalleryView() override;

  // Lists FOLDER's PNGs, newest first (read off the UI thread).
  void setFolder(const QString& folder);
  QString folder() const { return folder_; }
  // New results: shown first, in the order given.
  void addImages(const QStringList& paths);

  QStringList paths() const;  // as shown, newest first
  int count() const;
  QString currentPath() const;
  void setCurrentPath(const QString& path);
  QListView* listView() const { return list_; }
  GalleryModel* model() const { return model_; }
  ImageViewer* viewer() const { return viewer_; }
  QUndoStack* undoStack() const { return undo_; }

 public slots:
  void viewCurrent();    // click / Enter: the viewer at full size
  void deleteCurrent();  // to <folder>/.trash/, undoable

 signals:
  void reuseParameters(const QString& path);
  void reuseSeed(quint64 seed);
  void sendToImg2img(const QString& path);
  void statusMessage(const QString& message);

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;

 private:
  void elideCount();  // the header's text to the label's width, the folder's path shortened in the middle
  QString countText_;
  void showMenu(const QPoint& pos);
  void updateActions();
  void updateCount();
  void moveViewer(int delta);
  void viewRow(int row);
  QString parametersOf(const QString& path) const;
  QAction* action(const char* name, const QString& text, const QString& tip);

  QString folder_;
  GalleryModel* model_;
  QListView* list_;
  QLabel* count_;
  ImageViewer* viewer_;
  QUndoStack* undo_;
  QAction *reuseParams_, *reuseSeed_, *toImg2img_, *copyImage_, *copyPrompt_, *reveal_, *delete_, *undoDelete_, *view_;
  quint64 listing_ = 0;  // drops a stale folder listing
};

}  // namespace atelier::ui
