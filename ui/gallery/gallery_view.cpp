#include "gallery/gallery_view.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QDesktopServices>
#include <QDir>
#include <QFileInfo>
#include <QFuture>
#include <QHBoxLayout>
#include <QImageReader>
#include <QKeyEvent>
#include <QLabel>
#include <QListView>
#include <QMenu>
#include <QPainter>
#include <QPlainTextEdit>
#include <QScreen>
#include <QSplitter>
#include <QStyledItemDelegate>
#include <QUndoCommand>
#include <QUndoStack>
#include <QUrl>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>

#include <algorithm>

#include "paint/infotext.h"

namespace atelier::ui {

namespace {

struct Decoded {
  QImage image;
  QString parameters;
};

// A thumbnail (at most SIZE on its longer side) and the parameters text, read
// on a pool thread: only the scaled image is decoded (QImageReader::setScaledSize).
Decoded decode(const QString& path, int size) {
  QImageReader reader(path);
  reader.setAutoTransform(true);
  Decoded d;
  d.parameters = readPngText(path, QStringLiteral("parameters"));
  const QSize s = reader.size();
  // Large pictures decode at thumbnail size; small ones (a 64 x 64 test) are enlarged to fill the cell.
  if (size > 0 && s.isValid() && (s.width() > size || s.height() > size)) reader.setScaledSize(s.scaled(size, size, Qt::KeepAspectRatio));
  d.image = reader.read();
  if (size > 0 && !d.image.isNull() && d.image.width() != size && d.image.height() != size)
    d.image = d.image.scaled(size, size, Qt::KeepAspectRatio, Qt::SmoothTransformation);
  return d;
}

QString promptOf(const QString& parameters) { return parseInfotext(parameters).prompt; }

}  // namespace

// ---------------------------------------------------------------- GalleryModel

GalleryModel::GalleryModel(QObject* parent) : QAbstractListModel(parent) {
  pool_.setMaxThreadCount(2);
  setThumbnailSize(thumbSize_);
}

GalleryModel::~GalleryModel() {
  pool_.clear();
  pool_.waitForDone();
}

void GalleryModel::setThumbnailSize(int pixels) {
  thumbSize_ = pixels;
  QPixmap p(pixels, pixels);
  p.fill(Qt::transparent);
  QPainter painter(&p);
  painter.setRenderHint(QPainter::Antialiasing);
  painter.setPen(Qt::NoPen);
  painter.setBrush(QColor(128, 128, 128, 60));
  painter.drawRoundedRect(QRectF(4, 4, pixels - 8, pixels - 8), 6, 6);
  placeholder_ = p;
}

int GalleryModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(items_.size()); }

QVariant GalleryModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= items_.size()) return {};
  const std::shared_ptr<Item>& item = items_[index.row()];
  switch (role) {
    case Qt::DecorationRole:
      if (!item->requested) request(item);  // only what the view shows gets decoded
      return item->ready && !item->thumb.isNull() ? item->thumb : placeholder_;
    case Qt::ToolTipRole: {
      const QString name = QFileInfo(item->path).fileName();
      if (!item->ready) return name;
      QString prompt = promptOf(item->parameters);
      if (prompt.size() > 300) prompt = prompt.left(300) + QStringLiteral("\u2026");
      return prompt.isEmpty() ? name : name + QLatin1Char('\n') + prompt;
    }
    case Qt::AccessibleTextRole:
      return QFileInfo(item->path).fileName();
    case PathRole:
      return item->path;
    case ParametersRole:
      return item->parameters;
    case ThumbnailReadyRole:
      return item->ready;
    default:
      return {};
  }
}

void GalleryModel::request(const std::shared_ptr<Item>& item) const {
  item->requested = true;
  auto* self = const_cast<GalleryModel*>(this);
  std::weak_ptr<Item> weak = item;
  QtConcurrent::run(&pool_, decode, item->path, thumbSize_).then(self, [self, weak](Decoded d) {
    const std::shared_ptr<Item> it = weak.lock();
    if (!it) return;  // removed meanwhile
    it->thumb = QPixmap::fromImage(d.image);
    it->parameters = d.parameters;
    it->ready = true;
    const int row = static_cast<int>(self->items_.indexOf(it));
    if (row >= 0) {
      const QModelIndex i = self->index(row);
      emit self->dataChanged(i, i, {Qt::DecorationRole, Qt::ToolTipRole, ParametersRole, ThumbnailReadyRole});
    }
  });
}

void GalleryModel::setPaths(const QStringList& paths) {
  beginResetModel();
  items_.clear();
  for (const QString& p : paths) {
    auto item = std::make_shared<Item>();
    item->path = p;
    items_.push_back(std::move(item));
  }
  endResetModel();
}

void GalleryModel::insertPaths(int row, const QStringList& paths) {
  QStringList fresh;
  for (const QString& p : paths)
    if (!fresh.contains(p)) fresh << p;
  for (const QString& p : fresh) {
    const int at = rowOf(p);
    if (at < 0) continue;
    beginRemoveRows({}, at, at);
    items_.removeAt(at);
    endRemoveRows();
    if (at < row) --row;
  }
  if (fresh.isEmpty()) return;
  row = std::clamp(row, 0, static_cast<int>(items_.size()));
  beginInsertRows({}, row, row + static_cast<int>(fresh.size()) - 1);
  for (int k = 0; k < fresh.size(); ++k) {
    auto item = std::make_shared<Item>();
    item->path = fresh[k];
    items_.insert(row + k, std::move(item));
  }
  endInsertRows();
}

void GalleryModel::removePath(const QString& path) {
  const int row = rowOf(path);
  if (row < 0) return;
  beginRemoveRows({}, row, row);
  items_.removeAt(row);
  endRemoveRows();
}

int GalleryModel::rowOf(const QString& path) const {
  for (int i = 0; i < items_.size(); ++i)
    if (items_[i]->path == path) return i;
  return -1;
}

QString GalleryModel::pathAt(int row) const { return row >= 0 && row < items_.size() ? items_[row]->path : QString(); }

QStringList GalleryModel::paths() const {
  QStringList out;
  out.reserve(items_.size());
  for (const auto& i : items_) out << i->path;
  return out;
}

// ---------------------------------------------------------------- ImageViewer

class ImageViewer::Picture : public QWidget {
 public:
  explicit Picture(QWidget* parent) : QWidget(parent) {
    setMinimumSize(240, 240);
    setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
  }
  void setImage(const QImage& image) {
    image_ = image;
    update();
  }

 protected:
  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    p.fillRect(rect(), palette().color(QPalette::Base).darker(115));
    if (image_.isNull()) return;
    const QSizeF area = QSizeF(size()) - QSizeF(16, 16);
    // Fit, but never enlarge a big picture's pixels past 1:1 unless it is small.
    QSizeF s = image_.size();
    if (s.width() > area.width() || s.height() > area.height() || (s.width() < 256 && s.height() < 256))
      s = s.scaled(area, Qt::KeepAspectRatio);
    const QRectF r(QPointF((width() - s.width()) / 2, (height() - s.height()) / 2), s);
    p.setRenderHint(QPainter::SmoothPixmapTransform, s.width() < image_.width());
    p.drawImage(r, image_);
  }

 private:
  QImage image_;
};

ImageViewer::ImageViewer(QWidget* parent) : QDialog(parent) {
  setObjectName(QStringLiteral("galleryViewer"));
  setWindowTitle(tr("Image"));
  setSizeGripEnabled(true);
  auto* v = new QVBoxLayout(this);
  v->setContentsMargins(6, 6, 6, 6);
  auto* split = new QSplitter(Qt::Vertical, this);
  picture_ = new Picture(split);
  picture_->setObjectName(QStringLiteral("viewerPicture"));
  picture_->setToolTip(tr("Left/Right: previous/next image; Esc closes"));
  picture_->setFocusPolicy(Qt::StrongFocus);
  parameters_ = new QPlainTextEdit(split);
  parameters_->setObjectName(QStringLiteral("viewerParameters"));
  parameters_->setReadOnly(true);
  parameters_->setToolTip(tr("The generation parameters stored in the PNG (A1111 format)"));
  parameters_->setFocusPolicy(Qt::ClickFocus);
  split->addWidget(picture_);
  split->addWidget(parameters_);
  split->setStretchFactor(0, 1);
  split->setStretchFactor(1, 0);
  split->setSizes({640, 90});
  v->addWidget(split);
  if (const QScreen* screen = parent ? parent->screen() : QGuiApplication::primaryScreen())
    resize((screen->availableSize() * 0.6).expandedTo(QSize(480, 480)));
}

void ImageViewer::showImage(const QString& path, int index, int count) {
  path_ = path;
  setWindowTitle(tr("%1 \u2014 %2 of %3").arg(QFileInfo(path).fileName()).arg(index + 1).arg(count));
  const quint64 generation = ++generation_;
  QtConcurrent::run(decode, path, 0).then(this, [this, generation](Decoded d) {
    if (generation != generation_) return;
    image_ = d.image;
    picture_->setImage(d.image);
    parameters_->setPlainText(d.parameters);
  });
  QDialog::show();
  raise();
  activateWindow();
  picture_->setFocus();
}

void ImageViewer::keyPressEvent(QKeyEvent* event) {
  switch (event->key()) {
    case Qt::Key_Left:
    case Qt::Key_Up:
    case Qt::Key_PageUp:
      emit move(-1);
      return;
    case Qt::Key_Right:
    case Qt::Key_Down:
    case Qt::Key_PageDown:
    case Qt::Key_Space:
      emit move(+1);
      return;
    case Qt::Key_Home:
      emit moveTo(0);
      return;
    case Qt::Key_End:
      emit moveTo(-1);
      return;
    default:
      QDialog::keyPressEvent(event);
  }
}

// ---------------------------------------------------------------- GalleryView

namespace {

// The list, with a word for the empty gallery.
class GalleryList : public QListView {
 public:
  using QListView::QListView;

 protected:
  void paintEvent(QPaintEvent* event) override {
    QListView::paintEvent(event);
    if (model() && model()->rowCount() > 0) return;
    QPainter p(viewport());
    p.setPen(palette().color(QPalette::PlaceholderText));
    p.drawText(viewport()->rect().adjusted(12, 12, -12, -12), Qt::AlignCenter | Qt::TextWordWrap,
               QObject::tr("Your pictures appear here, newest first.\n\nClick one to see it at full size; "
                           "right-click to reuse its parameters or seed."));
  }
};

// A thumbnail centred in its cell; the current picture framed in the
// highlight colour, the one under the mouse in a lighter frame.
class ThumbnailDelegate : public QStyledItemDelegate {
 public:
  ThumbnailDelegate(int thumb, QObject* parent) : QStyledItemDelegate(parent), thumb_(thumb) {}
  QSize sizeHint(const QStyleOptionViewItem&, const QModelIndex&) const override { return {thumb_ + 10, thumb_ + 10}; }
  void paint(QPainter* p, const QStyleOptionViewItem& option, const QModelIndex& index) const override {
    p->save();
    p->setRenderHint(QPainter::Antialiasing);
    const QRectF cell = QRectF(option.rect).adjusted(1.5, 1.5, -1.5, -1.5);
    const bool selected = option.state & QStyle::State_Selected;
    const bool hover = option.state & QStyle::State_MouseOver;
    if (selected || hover) {
      QColor c = option.palette.color(QPalette::Highlight);
      c.setAlpha(selected ? 90 : 40);
      p->setBrush(c);
      p->setPen(QPen(option.palette.color(QPalette::Highlight), selected ? 2 : 1));
      p->drawRoundedRect(cell, 5, 5);
    }
    const QPixmap pix = index.data(Qt::DecorationRole).value<QPixmap>();
    if (!pix.isNull()) {
      const QSize s = pix.size().scaled(QSize(thumb_, thumb_).boundedTo(pix.size()), Qt::KeepAspectRatio);
      const QRect r(option.rect.center() - QPoint(s.width() / 2, s.height() / 2), s);
      p->drawPixmap(r, pix);
    }
    p->restore();
  }

 private:
  int thumb_;
};

// A deleted picture, moved to its folder's .trash/; undo moves it back to its row.
class TrashCommand : public QUndoCommand {
 public:
  TrashCommand(GalleryModel* model, QString original, QString trashed, int row)
      : model_(model), original_(std::move(original)), trashed_(std::move(trashed)), row_(row) {
    setText(QObject::tr("delete %1").arg(QFileInfo(original_).fileName()));
  }
  void redo() override {
    if (first_) {  // the move was done (and checked) before the command was pushed
      first_ = false;
      return;
    }
    if (QFile::rename(original_, trashed_)) model_->removePath(original_);
  }
  void undo() override {
    if (QFile::rename(trashed_, original_)) model_->insertPaths(std::min(row_, model_->rowCount()), {original_});
  }

 private:
  GalleryModel* model_;
  QString original_, trashed_;
  int row_;
  bool first_ = true;
};

}  // namespace

GalleryView::GalleryView(QWidget* parent) : QWidget(parent) {
  setObjectName(QStringLiteral("galleryView"));
  model_ = new GalleryModel(this);
  undo_ = new QUndoStack(this);
  auto* v = new QVBoxLayout(this);
  v->setContentsMargins(4, 4, 4, 4);
  v->setSpacing(4);
  count_ = new QLabel(this);
  count_->setObjectName(QStringLiteral("galleryCount"));
  count_->setToolTip(tr("The output folder shown here"));
  QPalette pal = count_->palette();
  pal.setColor(QPalette::WindowText, pal.color(QPalette::PlaceholderText));
  count_->setPalette(pal);
  count_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);  // a long folder path must not widen the dock
  v->addWidget(count_);
  list_ = new GalleryList(this);
  list_->setObjectName(QStringLiteral("galleryList"));
  list_->setModel(model_);
  list_->setViewMode(QListView::IconMode);
  list_->setResizeMode(QListView::Adjust);
  list_->setMovement(QListView::Static);
  list_->setUniformItemSizes(true);
  list_->setSelectionMode(QAbstractItemView::SingleSelection);
  list_->setIconSize(QSize(model_->thumbnailSize(), model_->thumbnailSize()));
  list_->setItemDelegate(new ThumbnailDelegate(model_->thumbnailSize(), list_));
  list_->setSpacing(2);
  list_->setMouseTracking(true);
  list_->setContextMenuPolicy(Qt::CustomContextMenu);
  list_->setToolTip(tr("Your pictures, newest first: click to view, right-click for more"));
  list_->setMinimumSize(model_->thumbnailSize() + 40, model_->thumbnailSize() + 40);
  list_->installEventFilter(this);
  v->addWidget(list_, 1);
  viewer_ = new ImageViewer(this);

  view_ = action("galleryViewImage", tr("&View"), tr("Show the picture at full size (Enter)"));
  reuseParams_ = action("galleryReuseParameters", tr("Reuse &parameters"), tr("Fill the Paint panel with this picture's parameters"));
  reuseSeed_ = action("galleryReuseSeed", tr("Reuse &seed"), tr("Use this picture's seed (locked) for the next job"));
  toImg2img_ = action("gallerySendToImg2img", tr("Send to &img2img"), tr("Start the next job from this picture"));
  copyImage_ = action("galleryCopyImage", tr("&Copy image"), tr("Copy the picture to the clipboard"));
  copyImage_->setShortcut(QKeySequence::Copy);
  copyPrompt_ = action("galleryCopyPrompt", tr("Copy p&rompt"), tr("Copy the picture's prompt to the clipboard"));
  reveal_ = action("galleryReveal", tr("Re&veal file"), tr("Open the folder that holds the picture"));
  delete_ = action("galleryDelete", tr("&Delete"), tr("Move the picture to the folder's .trash (Ctrl+Z brings it back)"));
  delete_->setShortcut(QKeySequence::Delete);
  undoDelete_ = action("galleryUndoDelete", tr("&Undo delete"), tr("Bring back the last deleted picture"));
  undoDelete_->setShortcut(QKeySequence::Undo);

  connect(view_, &QAction::triggered, this, &GalleryView::viewCurrent);
  connect(reuseParams_, &QAction::triggered, this, [this] {
    if (const QString p = currentPath(); !p.isEmpty()) emit reuseParameters(p);
  });
  connect(reuseSeed_, &QAction::triggered, this, [this] {
    const QString p = currentPath();
    if (p.isEmpty()) return;
    const Infotext info = parseInfotext(parametersOf(p));
    if (info.seed) emit reuseSeed(*info.seed);
    else emit statusMessage(tr("%1 records no seed").arg(QFileInfo(p).fileName()));
  });
  connect(toImg2img_, &QAction::triggered, this, [this] {
    if (const QString p = currentPath(); !p.isEmpty()) emit sendToImg2img(p);
  });
  connect(copyImage_, &QAction::triggered, this, [this] {
    const QString p = currentPath();
    if (p.isEmpty()) return;
    const QImage img(p);
    if (img.isNull()) return emit statusMessage(tr("Cannot read %1").arg(QFileInfo(p).fileName()));
    QApplication::clipboard()->setImage(img);
    emit statusMessage(tr("Copied %1").arg(QFileInfo(p).fileName()));
  });
  connect(copyPrompt_, &QAction::triggered, this, [this] {
    const QString p = currentPath();
    if (p.isEmpty()) return;
    const QString prompt = parseInfotext(parametersOf(p)).prompt;
    if (prompt.isEmpty()) return emit statusMessage(tr("%1 records no prompt").arg(QFileInfo(p).fileName()));
    QApplication::clipboard()->setText(prompt);
    emit statusMessage(tr("Copied the prompt of %1").arg(QFileInfo(p).fileName()));
  });
  connect(reveal_, &QAction::triggered, this, [this] {
    if (const QString p = currentPath(); !p.isEmpty())
      QDesktopServices::openUrl(QUrl::fromLocalFile(QFileInfo(p).absolutePath()));
  });
  connect(delete_, &QAction::triggered, this, &GalleryView::deleteCurrent);
  connect(undoDelete_, &QAction::triggered, undo_, &QUndoStack::undo);
  connect(undo_, &QUndoStack::canUndoChanged, this, &GalleryView::updateActions);
  connect(undo_, &QUndoStack::undoTextChanged, this, &GalleryView::updateActions);
  connect(list_, &QListView::clicked, this, [this](const QModelIndex& i) { viewRow(i.row()); });
  connect(list_, &QListView::customContextMenuRequested, this, &GalleryView::showMenu);
  connect(list_->selectionModel(), &QItemSelectionModel::currentChanged, this, &GalleryView::updateActions);
  connect(model_, &QAbstractItemModel::rowsInserted, this, &GalleryView::updateCount);
  connect(model_, &QAbstractItemModel::rowsRemoved, this, &GalleryView::updateCount);
  connect(model_, &QAbstractItemModel::modelReset, this, &GalleryView::updateCount);
  connect(viewer_, &ImageViewer::move, this, &GalleryView::moveViewer);
  connect(viewer_, &ImageViewer::moveTo, this, [this](int i) { viewRow(i < 0 ? model_->rowCount() - 1 : i); });
  updateActions();
  updateCount();
}

GalleryView::~GalleryView() = default;

QAction* GalleryView::action(const char* name, const QString& text, const QString& tip) {
  auto* a = new QAction(text, this);
  a->setObjectName(QLatin1String(name));
  a->setToolTip(tip);
  a->setStatusTip(tip);
  a->setShortcutContext(Qt::WidgetWithChildrenShortcut);
  list_->addAction(a);  // shortcuts work while the list has the focus
  return a;
}

void GalleryView::setFolder(const QString& folder) {
  folder_ = folder;
  const quint64 generation = ++listing_;
  updateCount();
  QtConcurrent::run([folder] {
    QStringList out;
    const QFileInfoList files = QDir(folder).entryInfoList({QStringLiteral("*.png")}, QDir::Files | QDir::Readable, QDir::Time);
    for (const QFileInfo& f : files) out << f.absoluteFilePath();
    return out;
  }).then(this, [this, generation](QStringList paths) {
    if (generation != listing_) return;
    // Pictures added while the folder was being read stay on top.
    QStringList keep;
    for (const QString& p : model_->paths())
      if (!paths.contains(p)) keep << p;
    model_->setPaths(keep + paths);
    if (model_->rowCount() > 0 && !list_->currentIndex().isValid()) list_->setCurrentIndex(model_->index(0));
    updateCount();
  });
}

void GalleryView::addImages(const QStringList& paths) {
  QStringList abs;
  for (const QString& p : paths) abs << QFileInfo(p).absoluteFilePath();
  if (abs.isEmpty()) return;
  model_->insertPaths(0, abs);
  list_->setCurrentIndex(model_->index(0));
  list_->scrollToTop();
}

QStringList GalleryView::paths() const { return model_->paths(); }
int GalleryView::count() const { return model_->rowCount(); }
QString GalleryView::currentPath() const { return model_->pathAt(list_->currentIndex().row()); }

void GalleryView::setCurrentPath(const QString& path) {
  const int row = model_->rowOf(QFileInfo(path).absoluteFilePath());
  if (row >= 0) list_->setCurrentIndex(model_->index(row));
}

QString GalleryView::parametersOf(const QString& path) const {
  const int row = model_->rowOf(path);
  if (row >= 0 && model_->data(model_->index(row), GalleryModel::ThumbnailReadyRole).toBool())
    return model_->data(model_->index(row), GalleryModel::ParametersRole).toString();
  return readPngText(path, QStringLiteral("parameters"));  // the text chunks only
}

bool GalleryView::eventFilter(QObject* watched, QEvent* event) {
  if (watched == list_ && event->type() == QEvent::KeyPress) {
    const int key = static_cast<QKeyEvent*>(event)->key();
    if (key == Qt::Key_Return || key == Qt::Key_Enter) {
      viewCurrent();
      return true;
    }
  }
  return QWidget::eventFilter(watched, event);
}

void GalleryView::viewCurrent() { viewRow(list_->currentIndex().row()); }

void GalleryView::viewRow(int row) {
  if (row < 0 || row >= model_->rowCount()) return;
  list_->setCurrentIndex(model_->index(row));
  viewer_->showImage(model_->pathAt(row), row, model_->rowCount());
}

void GalleryView::moveViewer(int delta) {
  int row = model_->rowOf(viewer_->path());
  if (row < 0) row = list_->currentIndex().row();
  const int next = std::clamp(row + delta, 0, std::max(0, model_->rowCount() - 1));
  if (next != row) viewRow(next);
}

void GalleryView::deleteCurrent() {
  const QString path = currentPath();
  if (path.isEmpty()) return;
  const QFileInfo fi(path);
  const QDir trash(fi.dir().filePath(QStringLiteral(".trash")));
  if (!QDir().mkpath(trash.path())) {
    emit statusMessage(tr("Cannot create %1: %2 was not deleted").arg(trash.path(), fi.fileName()));
    return;
  }
  QString target = trash.filePath(fi.fileName());
  for (int n = 2; QFile::exists(target); ++n)
    target = trash.filePath(QStringLiteral("%1 (%2).%3").arg(fi.completeBaseName()).arg(n).arg(fi.suffix()));
  if (!QFile::rename(path, target)) {
    emit statusMessage(tr("Cannot move %1 to %2").arg(fi.fileName(), trash.path()));
    return;
  }
  const int row = model_->rowOf(path);
  model_->removePath(path);
  undo_->push(new TrashCommand(model_, path, target, row));
  if (model_->rowCount() > 0) list_->setCurrentIndex(model_->index(std::min(row, model_->rowCount() - 1)));
  if (viewer_->isVisible() && viewer_->path() == path) {
    if (model_->rowCount() > 0) viewCurrent();
    else viewer_->hide();
  }
  emit statusMessage(tr("Moved %1 to %2 (Ctrl+Z undoes)").arg(fi.fileName(), QDir::toNativeSeparators(trash.path())));
}

void GalleryView::showMenu(const QPoint& pos) {
  const QModelIndex index = list_->indexAt(pos);
  if (index.isValid()) list_->setCurrentIndex(index);
  updateActions();
  QMenu menu(this);
  if (index.isValid()) {
    menu.addAction(view_);
    menu.addSeparator();
    menu.addAction(reuseParams_);
    menu.addAction(reuseSeed_);
    menu.addAction(toImg2img_);
    menu.addSeparator();
    menu.addAction(copyImage_);
    menu.addAction(copyPrompt_);
    menu.addAction(reveal_);
    menu.addSeparator();
    menu.addAction(delete_);
  }
  menu.addAction(undoDelete_);
  menu.exec(list_->viewport()->mapToGlobal(pos));
}

void GalleryView::updateActions() {
  const bool has = list_->currentIndex().isValid();
  for (QAction* a : {view_, reuseParams_, reuseSeed_, toImg2img_, copyImage_, copyPrompt_, reveal_, delete_}) a->setEnabled(has);
  undoDelete_->setEnabled(undo_->canUndo());
  undoDelete_->setText(undo_->canUndo() ? tr("&Undo %1").arg(undo_->undoText()) : tr("&Undo delete"));
}

void GalleryView::updateCount() {
  const QString where = folder_.isEmpty() ? QString() : QDir::toNativeSeparators(folder_);
  const int n = model_->rowCount();
  countText_ = (n == 1 ? tr("1 picture") : tr("%1 pictures").arg(n)) + (where.isEmpty() ? QString() : QStringLiteral(" \u00b7 ") + where);
  elideCount();
  count_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  count_->setToolTip(where.isEmpty() ? tr("No output folder yet") : tr("The output folder: %1").arg(where));
}

void GalleryView::elideCount() {
  count_->setText(count_->fontMetrics().elidedText(countText_, Qt::ElideMiddle, std::max(40, count_->width())));
}

void GalleryView::resizeEvent(QResizeEvent* event) {
  QWidget::resizeEvent(event);
  // The label has its new width once the layout has run.
  QMetaObject::invokeMethod(this, &GalleryView::elideCount, Qt::QueuedConnection);
}

}  // namespace atelier::ui
