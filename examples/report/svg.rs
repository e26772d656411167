//! The report's plot, written as SVG by hand: compile time against the time of one
//! 60k-sample epoch, both on log scales, one labelled point per compiled row and a dashed
//! line per hand-written row (which has no compile step).

use std::fmt::Write as _;

/// What a row is, which decides how it is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Interpreter,
    Jit,
    HandWritten,
}

impl Kind {
    fn color(self) -> &'static str {
        match self {
            Kind::Interpreter => "#6b6b6b",
            Kind::Jit => "#1f5fbf",
            Kind::HandWritten => "#d9731a",
        }
    }

    fn legend(self) -> &'static str {
        match self {
            Kind::Interpreter => "interpreter",
            Kind::Jit => "JIT",
            Kind::HandWritten => "hand-written Rust (no compile step: dashed)",
        }
    }
}

pub struct Point {
    pub label: String,
    pub compile_secs: f64,
    pub epoch_secs: f64,
    pub kind: Kind,
}

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 70.0;
const BOTTOM: f64 = 60.0;
const LINE: f64 = 15.0;
/// About how wide a character of the 12 px sans-serif labels is.
const CHAR_WIDTH: f64 = 6.8;

/// An axis-aligned box in SVG coordinates, for placing labels.
#[derive(Clone)]
struct Rect {
    x0: f64,
    y0: f64,
    x1: f64,
    y1: f64,
}

impl Rect {
    fn at(x: f64, y: f64, w: f64, h: f64) -> Rect {
        Rect {
            x0: x,
            y0: y,
            x1: x + w,
            y1: y + h,
        }
    }

    fn overlaps(&self, o: &Rect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }

    fn contains(&self, o: &Rect) -> bool {
        self.x0 <= o.x0 && o.x1 <= self.x1 && self.y0 <= o.y0 && o.y1 <= self.y1
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `12`, `2.5`, `0.01`: short tick labels.
fn short(x: f64) -> String {
    if x >= 1.0 {
        return format!("{x:.0}");
    }
    let s = format!("{x:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Seconds with two or three significant digits.
fn short_secs(s: f64) -> String {
    if s <= 0.0 {
        return "0".into();
    }
    let digits = if s >= 1.0 {
        2 - (s.log10().floor() as i32).min(2)
    } else {
        1 - s.log10().floor() as i32
    };
    format!("{s:.*}", digits.max(0) as usize)
}

/// A log axis: the decades `10^lo ..= 10^hi` covering the positive `values`, and the map from
/// a value to a fraction of the axis.
struct LogAxis {
    lo: i32,
    hi: i32,
}

impl LogAxis {
    fn covering(values: impl Iterator<Item = f64>) -> LogAxis {
        let (mut min, mut max) = (f64::INFINITY, 0.0f64);
        for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
            min = min.min(v);
            max = max.max(v);
        }
        if max == 0.0 {
            return LogAxis { lo: 0, hi: 1 };
        }
        let lo = min.log10().floor() as i32;
        LogAxis {
            lo,
            hi: (max.log10().ceil() as i32).max(lo + 1),
        }
    }

    fn fraction(&self, v: f64) -> f64 {
        let v = v.max(10f64.powi(self.lo));
        (v.log10() - self.lo as f64) / (self.hi - self.lo) as f64
    }

    /// Grid values: `(value, is_decade)` for 1, 2 and 5 times each power of ten.
    fn ticks(&self) -> Vec<(f64, bool)> {
        let mut ticks = Vec::new();
        for d in self.lo..=self.hi {
            for m in [1.0, 2.0, 5.0] {
                if d == self.hi && m > 1.0 {
                    break;
                }
                ticks.push((m * 10f64.powi(d), m == 1.0));
            }
        }
        ticks
    }
}

pub fn plot(title: &str, points: &[Point]) -> String {
    let xs = LogAxis::covering(points.iter().map(|p| p.compile_secs));
    let ys = LogAxis::covering(points.iter().map(|p| p.epoch_secs));
    let (pw, ph) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let x_of = |s: f64| LEFT + pw * xs.fraction(s);
    let y_of = |s: f64| TOP + ph * (1.0 - ys.fraction(s));

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<text x="{}" y="38" text-anchor="middle" fill="#555">lower trains faster, further left starts sooner</text>"##,
        WIDTH / 2.0,
        escape(title),
        WIDTH / 2.0
    );

    // Grid and tick labels.
    for (v, decade) in xs.ticks() {
        let px = x_of(v);
        let stroke = if decade { "#d0d0d0" } else { "#f0f0f0" };
        let label = if decade { short(v) } else { String::new() };
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{}" stroke="{stroke}"/><text x="{px:.1}" y="{}" text-anchor="middle">{label}</text>"##,
            TOP + ph,
            TOP + ph + 18.0,
        );
    }
    for (v, decade) in ys.ticks() {
        let py = y_of(v);
        let stroke = if decade { "#d0d0d0" } else { "#f0f0f0" };
        let label = if decade { short(v) } else { String::new() };
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="{stroke}"/><text x="{}" y="{:.1}" text-anchor="end">{label}</text>"##,
            LEFT + pw,
            LEFT - 8.0,
            py + 4.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>
<text x="{}" y="{}" text-anchor="middle">compile time (s, log scale)</text>
<text transform="translate(22 {}) rotate(-90)" text-anchor="middle">time per 60,000-sample epoch (s, log scale)</text>"##,
        LEFT + pw / 2.0,
        HEIGHT - 18.0,
        TOP + ph / 2.0
    );

    // Marks first: dashed lines for rows without a compile step, points for the others.
    let mut taken: Vec<Rect> = Vec::new();
    let mut anchors = Vec::new();
    for p in points {
        let py = y_of(p.epoch_secs);
        if p.compile_secs > 0.0 {
            let px = x_of(p.compile_secs);
            let _ = writeln!(
                svg,
                r#"<circle cx="{px:.1}" cy="{py:.1}" r="5" fill="{}"/>"#,
                p.kind.color()
            );
            taken.push(Rect::at(px - 6.0, py - 6.0, 12.0, 12.0));
            anchors.push(Some(px));
        } else {
            let _ = writeln!(
                svg,
                r#"<line x1="{LEFT}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="{}" stroke-width="1.5" stroke-dasharray="6 4"/>"#,
                LEFT + pw,
                p.kind.color()
            );
            anchors.push(None);
        }
    }

    // Labels where they hide no point and no other label.
    let area = Rect {
        x0: LEFT + 2.0,
        y0: TOP + 2.0,
        x1: LEFT + pw - 2.0,
        y1: TOP + ph - 2.0,
    };
    for (p, anchor) in points.iter().zip(anchors) {
        let py = y_of(p.epoch_secs);
        let text = match anchor {
            Some(_) => format!(
                "{} ({} s compile, {} s/epoch)",
                p.label,
                short_secs(p.compile_secs),
                short_secs(p.epoch_secs)
            ),
            None => format!("{} ({} s/epoch)", p.label, short_secs(p.epoch_secs)),
        };
        let (w, h) = (text.chars().count() as f64 * CHAR_WIDTH, LINE);
        let (candidates, px) = match anchor {
            // Right, left, above, below the point, then further away with a leader line.
            Some(px) => {
                let mut c = vec![
                    Rect::at(px + 9.0, py - h / 2.0, w, h),
                    Rect::at(px - 9.0 - w, py - h / 2.0, w, h),
                    Rect::at(px - w / 2.0, py - 9.0 - h, w, h),
                    Rect::at(px - w / 2.0, py + 9.0, w, h),
                ];
                for n in 1..12 {
                    let dy = n as f64 * h;
                    for (dx, sign) in [(14.0, 1.0), (-14.0 - w, 1.0), (14.0, -1.0)] {
                        c.push(Rect::at(px + dx, py - h / 2.0 + sign * dy, w, h));
                    }
                    c.push(Rect::at(px - 14.0 - w, py - h / 2.0 - dy, w, h));
                }
                (c, px)
            }
            // Above the dashed line, at its right end, else below it.
            None => {
                let x = LEFT + pw - 6.0 - w;
                (
                    vec![Rect::at(x, py - 3.0 - h, w, h), Rect::at(x, py + 3.0, w, h)],
                    x + w,
                )
            }
        };
        let fits = |r: &Rect| area.contains(r) && !taken.iter().any(|t| t.overlaps(r));
        let r = candidates
            .iter()
            .find(|r| fits(r))
            .unwrap_or(&candidates[0])
            .clone();
        let (cx, cy) = (r.x0.max(px.min(r.x1)), r.y0.max(py.min(r.y1)));
        if anchor.is_some() && (cx - px).hypot(cy - py) > 12.0 {
            let _ = writeln!(
                svg,
                r##"<line x1="{px:.1}" y1="{py:.1}" x2="{cx:.1}" y2="{cy:.1}" stroke="#aaa"/>"##
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            r.x0,
            r.y1 - 3.5,
            escape(&text)
        );
        taken.push(r);
    }

    // Legend, under the subtitle.
    let mut x = LEFT;
    for kind in [Kind::Interpreter, Kind::Jit, Kind::HandWritten] {
        if !points.iter().any(|p| p.kind == kind) {
            continue;
        }
        let _ = writeln!(
            svg,
            r#"<circle cx="{x:.1}" cy="{:.1}" r="5" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            TOP - 12.0,
            kind.color(),
            x + 9.0,
            TOP - 8.0,
            kind.legend()
        );
        x += 30.0 + kind.legend().len() as f64 * CHAR_WIDTH;
    }
    svg.push_str("</svg>\n");
    svg
}
