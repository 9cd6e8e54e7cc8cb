// The Paint tab's two picture areas: PaintCanvas shows the live preview and
// the results (scaled to fit); MaskEditor shows the img2img init image and
// paints the inpainting mask over it with a round brush (white = repaint).
// Both take image files dropped on them.
#pragma once

#include <QImage>
#include <QPoint>
#include <QString>
#include <QWidget>

class QMimeData;

namespace atelier::ui {

// The first local image file of a drop ("" when it carries none).
QString droppedImagePath(const QMimeData* mime);

class PaintCanvas : public QWidget {
  Q_OBJECT

 public:
  explicit PaintCanvas(QWidget* parent = nullptr);
  void setImage(const QImage& image);  // a null image shows the placeholder
  QImage image() const { return image_; }
  void setPlaceholder(const QString& text);
  QSize sizeHint() const override { return {512, 512}; }
  QSize minimumSizeHint() const override { return {256, 256}; }

 signals:
  void imageChanged();                       // after every setImage
  void fileDropped(const QString& path);     // an image file dropped here

 protected:
  void paintEvent(QPaintEvent* event) override;
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  QImage image_;
  QString placeholder_;
};

class MaskEditor : public QWidget {
  Q_OBJECT

 public:
  explicit MaskEditor(QWidget* parent = nullptr);
  // Shows IMAGE as the init image and starts an empty mask of its size.
  void setImage(const QImage& image);
  QImage image() const { return image_; }
  bool hasImage() const { return !image_.isNull(); }
  // The mask at the init image's size: white repaints, black keeps (RGB32).
  QImage mask() const { return mask_; }
  bool hasMask() const { return painted_ > 0; }
  double coverage() const;  // share of the image's pixels marked for repainting, 0..1
  void clearMask();
  void setBrushSize(int pixels);  // diameter in init-image pixels
  int brushSize() const { return brush_; }
  void setErasing(bool erasing) { erasing_ = erasing; }
  bool erasing() const { return erasing_; }
  // One brush stroke through POINTS (init-image pixels), as a drag would paint it.
  void paintStroke(const QList<QPoint>& points);
  void setPlaceholder(const QString& text);
  QSize sizeHint() const override { return {512, 512}; }
  QSize minimumSizeHint() const override { return {256, 256}; }

 signals:
  void maskChanged();
  void fileDropped(const QString& path);

 protected:
  void paintEvent(QPaintEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void leaveEvent(QEvent* event) override;
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  QRectF imageRect() const;  // where the image is drawn, in widget coordinates
  QPointF toImage(const QPointF& widgetPos) const;
  void strokeTo(const QPointF& imagePos, bool first);
  void recount();

  QImage image_, mask_, overlay_;
  int brush_ = 32;
  bool erasing_ = false;
  bool drawing_ = false;
  QPointF last_;
  QPointF hover_{-1, -1};
  qint64 painted_ = 0;  // white mask pixels
  QString placeholder_;
};

}  // namespace atelier::ui
