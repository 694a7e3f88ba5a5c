// The waveform, drawn as the audio comes.

/** A waveform drawn scaled to its peak (a quiet model's audio would be a flat line beside a
 * loud one's); ``caption`` says the true peak and the scale. */
export class Wave {
  constructor(canvas, rate, caption = null) {
    this.canvas = canvas;
    this.caption = caption;
    this.rate = rate;
    this.blocks = [];
    this.length = 0;
    this.peak = 0; // of |sample| / 32768
    this.pending = false;
    this.draw();
  }

  add(block) {
    this.blocks.push(block);
    this.length += block.length;
    for (let i = 0; i < block.length; i += 1) {
      const value = Math.abs(block[i]) / 32768;
      if (value > this.peak) this.peak = value;
    }
    if (!this.pending) {
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.draw(); });
    }
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    // the drawn size in device pixels (a hidden canvas keeps its own)
    const width = canvas.clientWidth ? Math.round(canvas.clientWidth * ratio) : canvas.width;
    const height = canvas.clientHeight ? Math.round(canvas.clientHeight * ratio) : canvas.height;
    if (canvas.width !== width) canvas.width = width;
    if (canvas.height !== height) canvas.height = height;
    const style = getComputedStyle(document.documentElement);
    const g = canvas.getContext("2d");
    g.clearRect(0, 0, width, height);
    g.fillStyle = style.getPropertyValue("--wave-axis").trim() || "#999";
    g.fillRect(0, Math.floor(height / 2), width, Math.max(1, ratio));
    this.describe();
    if (!this.length) return;
    const scale = this.peak > 0 ? 1 / this.peak : 1;
    // at least five seconds across, so that a stream grows from the left as it comes
    const span = Math.max(this.length, this.rate * 5);
    const perColumn = span / width;
    const columns = Math.ceil(this.length / perColumn);
    const low = new Float32Array(columns).fill(1);
    const high = new Float32Array(columns).fill(-1);
    let index = 0;
    for (const block of this.blocks) {
      for (let i = 0; i < block.length; i += 1, index += 1) {
        const column = Math.floor(index / perColumn);
        const value = block[i] / 32768;
        if (value < low[column]) low[column] = value;
        if (value > high[column]) high[column] = value;
      }
    }
    g.fillStyle = style.getPropertyValue("--wave").trim() || "#06c";
    const middle = height / 2;
    for (let x = 0; x < columns; x += 1) {
      const top = middle - high[x] * scale * middle;
      const bottom = middle - low[x] * scale * middle;
      g.fillRect(x, top, 1, Math.max(1, bottom - top));
    }
  }

  describe() {
    this.canvas.dataset.peak = String(this.peak);
    if (!this.caption) return;
    if (!this.length || this.peak === 0) {
      this.caption.textContent = this.length ? "Silent: every sample is 0." : "";
      return;
    }
    const db = 20 * Math.log10(this.peak);
    const scale = 1 / this.peak;
    this.caption.textContent = `Peak ${this.peak.toFixed(3)} (${db.toFixed(1)} dBFS)`
      + (scale > 1.05 ? `, drawn ×${scale.toFixed(1)} to fit` : "");
  }
}
