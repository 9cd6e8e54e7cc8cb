#include "paint/paint_canvas.h"

#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileInfo>
#include <QImageReader>
#include <QMimeData>
#include <QMouseEvent>
#include <QPainter>
#include <QPainterPath>

#include <algorithm>

namespace atelier::ui {

namespace {

// Fits SIZE into AREA keeping its aspect ratio, centred.
QRectF fitted(const QSizeF& size, const QRectF& area) {
  if (size.isEmpty() || area.isEmpty()) return {};
  const QSizeF s = size.scaled(area.size(), Qt::KeepAspectRatio);
  return QRectF(area.center() - QPointF(s.width() / 2, s.height() / 2), s);
}

// A quiet backdrop: the window's dark shade with a thin frame.
void paintBackdrop(QPainter& p, const QWidget* w) {
  const QRect r = w->rect();
  p.fillRect(r, w->palette().color(QPalette::Base).darker(115));
  p.setPen(QPen(w->palette().color(QPalette::Mid), 1));
  p.drawRect(r.adjusted(0, 0, -1, -1));
}

void paintPlaceholder(QPainter& p, const QWidget* w, const QString& text) {
  p.setPen(w->palette().color(QPalette::PlaceholderText));
  p.drawText(w->rect().adjusted(24, 24, -24, -24), Qt::AlignCenter | Qt::TextWordWrap, text);
}

}  // namespace

QString droppedImagePath(const QMimeData* mime) {
  if (!mime || !mime->hasUrls()) return {};
  const QList<QByteArray> formats = QImageReader::supportedImageFormats();
  for (const QUrl& url : mime->urls()) {
    if (!url.isLocalFile()) continue;
    const QString path = url.toLocalFile();
    if (formats.contains(QFileInfo(path).suffix().toLower().toLatin1())) return path;
  }
  return {};
}

// ---------------------------------------------------------------- PaintCanvas

PaintCanvas::PaintCanvas(QWidget* parent) : QWidget(parent) {
  setAcceptDrops(true);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
  setAttribute(Qt::WA_OpaquePaintEvent);
}

void PaintCanvas::setImage(const QImage& image) {
  image_ = image;
  update();
  emit imageChanged();
}

void PaintCanvas::setPlaceholder(const QString& text) {
  placeholder_ = text;
  update();
}

void PaintCanvas::paintEvent(QPaintEvent*) {
  QPainter p(this);
  paintBackdrop(p, this);
  if (image_.isNull()) return paintPlaceholder(p, this, placeholder_);
  p.setRenderHint(QPainter::SmoothPixmapTransform);
  p.drawImage(fitted(image_.size(), QRectF(rect()).adjusted(8, 8, -8, -8)), image_);
}

void PaintCanvas::dragEnterEvent(QDragEnterEvent* event) {
  if (!droppedImagePath(event->mimeData()).isEmpty()) event->acceptProposedAction();
}

void PaintCanvas::dropEvent(QDropEvent* event) {
  const QString path = droppedImagePath(event->mimeData());
  if (path.isEmpty()) return;
  event->acceptProposedAction();
  emit fileDropped(path);
}

// ---------------------------------------------------------------- MaskEditor

MaskEditor::MaskEditor(QWidget* parent) : QWidget(parent) {
  setAcceptDrops(true);
  setMouseTracking(true);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
  setAttribute(Qt::WA_OpaquePaintEvent);
}

void MaskEditor::setImage(const QImage& image) {
  image_ = image.convertToFormat(QImage::Format_RGB32);
  mask_ = QImage(image_.size(), QImage::Format_RGB32);
  overlay_ = QImage(image_.size(), QImage::Format_ARGB32_Premultiplied);
  clearMask();
}

void MaskEditor::setPlaceholder(const QString& text) {
  placeholder_ = text;
  update();
}

void MaskEditor::clearMask() {
  if (!mask_.isNull()) mask_.fill(Qt::black);
  if (!overlay_.isNull()) overlay_.fill(Qt::transparent);
  painted_ = 0;
  update();
  emit maskChanged();
}

void MaskEditor::setBrushSize(int pixels) {
  brush_ = std::clamp(pixels, 1, 1024);
  update();
}

double MaskEditor::coverage() const {
  const qint64 all = static_cast<qint64>(mask_.width()) * mask_.height();
  return all ? static_cast<double>(painted_) / static_cast<double>(all) : 0.0;
}

void MaskEditor::recount() {
  qint64 n = 0;
  for (int y = 0; y < mask_.height(); ++y) {
    const QRgb* row = reinterpret_cast<const QRgb*>(mask_.constScanLine(y));
    for (int x = 0; x < mask_.width(); ++x) n += qRed(row[x]) > 127;
  }
  painted_ = n;
}

QRectF MaskEditor::imageRect() const { return fitted(image_.size(), QRectF(rect()).adjusted(8, 8, -8, -8)); }

QPointF MaskEditor::toImage(const QPointF& pos) const {
  const QRectF r = imageRect();
  if (r.isEmpty()) return {};
  return {(pos.x() - r.left()) * image_.width() / r.width(), (pos.y() - r.top()) * image_.height() / r.height()};
}

void MaskEditor::strokeTo(const QPointF& at, bool first) {
  if (mask_.isNull()) return;
  const QPen maskPen(erasing_ ? Qt::black : Qt::white, brush_, Qt::SolidLine, Qt::RoundCap, Qt::RoundJoin);
  const QPen overlayPen(erasing_ ? QColor(Qt::transparent) : QColor(255, 48, 64, 150), brush_, Qt::SolidLine,
                        Qt::RoundCap, Qt::RoundJoin);
  for (auto [img, pen] : {std::pair{&mask_, &maskPen}, std::pair{&overlay_, &overlayPen}}) {
    QPainter p(img);
    p.setRenderHint(QPainter::Antialiasing, false);  // a hard mask: every pixel is in or out
    p.setCompositionMode(QPainter::CompositionMode_Source);
    p.setPen(*pen);
    if (first) p.drawPoint(at);
    else p.drawLine(last_, at);
  }
  last_ = at;
  update();
}

void MaskEditor::paintStroke(const QList<QPoint>& points) {
  for (int i = 0; i < points.size(); ++i) strokeTo(points[i], i == 0);
  recount();
  emit maskChanged();
}

void MaskEditor::paintEvent(QPaintEvent*) {
  QPainter p(this);
  paintBackdrop(p, this);
  if (image_.isNull()) return paintPlaceholder(p, this, placeholder_);
  const QRectF r = imageRect();
  p.setRenderHint(QPainter::SmoothPixmapTransform);
  p.drawImage(r, image_);
  p.drawImage(r, overlay_);
  if (hover_.x() >= 0 && r.contains(hover_)) {
    const double radius = brush_ * r.width() / image_.width() / 2;
    p.setRenderHint(QPainter::Antialiasing);
    p.setBrush(Qt::NoBrush);
    p.setPen(QPen(QColor(0, 0, 0, 160), 3));
    p.drawEllipse(hover_, radius, radius);
    p.setPen(QPen(erasing_ ? QColor(120, 200, 255) : QColor(255, 255, 255), 1.5));
    p.drawEllipse(hover_, radius, radius);
  }
}

void MaskEditor::mousePressEvent(QMouseEvent* event) {
  if (event->button() != Qt::LeftButton || image_.isNull()) return;
  drawing_ = true;
  strokeTo(toImage(event->position()), true);
}

void MaskEditor::mouseMoveEvent(QMouseEvent* event) {
  hover_ = event->position();
  if (drawing_) strokeTo(toImage(event->position()), false);
  else update();
}

void MaskEditor::mouseReleaseEvent(QMouseEvent* event) {
  if (event->button() != Qt::LeftButton || !drawing_) return;
  drawing_ = false;
  recount();
  emit maskChanged();
}

void MaskEditor::leaveEvent(QEvent*) {
  hover_ = {-1, -1};
  update();
}

void MaskEditor::dragEnterEvent(QDragEnterEvent* event) {
  if (!droppedImagePath(event->mimeData()).isEmpty()) event->acceptProposedAction();
}

void MaskEditor::dropEvent(QDropEvent* event) {
  const QString path = droppedImagePath(event->mimeData());
  if (path.isEmpty()) return;
  event->acceptProposedAction();
  emit fileDropped(path);
}

}  // namespace atelier::ui
