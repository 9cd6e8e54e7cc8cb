// The engine monitor: a Dear ImGui panel drawn in a QOpenGLWidget (ImGui's
// OpenGL3 renderer from Debian's libimgui-dev) with scrolling plots of the
// engine's metrics — tokens/s, image steps/s, batch size, queue depth by
// kind, P50/P99 time to first token and inter-token latency, KV blocks used,
// cached and free, memory, busy fraction, error rate — the alert rules'
// thresholds drawn on their plots, and the alerts listed as they fire.
// Metrics are polled through the bridge (never on the UI thread); the panel
// polls only while it is visible (not behind another dock tab) and redraws
// only when a poll's figures changed (or the mouse moves over it): at most
// four frames a second, none on an idle engine.
#pragma once

#include <QElapsedTimer>
#include <QOpenGLWidget>
#include <QTimer>

#include <vector>

#include "bridge/engine_bridge.h"
#include "monitor/monitor_data.h"

struct ImGuiContext;

namespace atelier::ui {

class EngineMonitor : public QOpenGLWidget {
  Q_OBJECT

 public:
  explicit EngineMonitor(bridge::EngineBridge* bridge, QWidget* parent = nullptr);
  ~EngineMonitor() override;

  const MonitorData& data() const { return data_; }
  MonitorData& data() { return data_; }
  void setPollMs(int ms) { poll_.setInterval(ms); }
  int polls() const { return polls_; }  // metrics answers received

  // UI-thread time of the recent frames (building the ImGui frame and drawing it), in ms.
  struct FrameStats {
    int frames = 0;
    double median_ms = 0, p90_ms = 0, max_ms = 0;
    double build_median_ms = 0;  // of which: the ImGui frame (plots, text), without the GL draw
  };
  FrameStats frameStats() const;
  void resetFrameStats();
  bool rendererReady() const { return rendererReady_; }
  // Whether this platform can give the panel an OpenGL context (Qt's offscreen platform cannot).
  static bool openGLAvailable();
  // VALUE as a plain number with its UNIT ("26200 tok/s", "12.3 ms"); UNIT "bytes" picks KiB/MiB/GiB.
  static QByteArray figure(double value, const char* unit);

 public slots:
  void pollNow();

 signals:
  void sampled();  // a metrics sample was added

 protected:
  void initializeGL() override;
  void paintGL() override;
  void resizeGL(int w, int h) override;
  void showEvent(QShowEvent* event) override;
  void hideEvent(QHideEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;

 private:
  void buildFrame();  // the ImGui frame from data_

  bridge::EngineBridge* bridge_;
  MonitorData data_;
  QTimer poll_;
  QElapsedTimer clock_, lastFrame_;
  ImGuiContext* imgui_ = nullptr;
  bool rendererReady_ = false;
  bool pollInFlight_ = false;
  int polls_ = 0;
  double drawnDeviceBytes_ = 0;  // the device memory figure the last frame showed
  std::vector<double> frameMs_, buildMs_;
};

}  // namespace atelier::ui
