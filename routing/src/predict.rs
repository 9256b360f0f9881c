//! Recognising a tenant's periodic runs and predicting the next one.
//!
//! A *run* is the first connection after the tenant slept, or after a quiet gap; the caller
//! reports each run's start with [`RunHistory::record_run`]. From the starts of the last few
//! runs the history recognises two kinds of pattern, and says nothing otherwise:
//!
//! - **periodic:** the last [`RECENT`] intervals agree within a tenth of their median (a cron job
//!   every 15 minutes ± 20 s, an hourly job at :00), and while only those runs keep to the
//!   period, they lie within a thirtieth of it of an evenly spaced schedule;
//! - **daily:** the recent intervals are whole days (one to three, so weekends may be skipped)
//!   within [`DAILY_TOLERANCE`] and the runs start near the same time of day; the next run is
//!   predicted for the next day while the runs came on consecutive days, and once a day was
//!   skipped, on the next weekday that has had a run (a preview environment opened every
//!   weekday morning).
//!
//! Once [`MAX_MISSES`] predicted runs have passed without a run, the history stays silent until
//! the next one comes: a tenant that stopped soon stops being woken. A pattern recognised from
//! the fewest runs whose first prediction no run kept was a false start: it stays silent after
//! that one miss, and while the false start is remembered the tenant needs one more agreeing run
//! for its next pattern. Random runs fall into a few agreeing intervals now and then, far more
//! rarely into one more.
//!
//! Times are seconds since the Unix epoch (UTC) passed in by the caller, so the module does no
//! I/O and reads no clock, and its state is a fixed-size array.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a tenant's run predictions are used for (`wake.predict`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PredictPolicy {
    /// Nothing: the tenant wakes on its first connection and sleeps after its idle timeout.
    #[default]
    Off,
    /// Wake the tenant ahead of a predicted run.
    Wake,
    /// Wake it ahead of a predicted run, and put it to sleep soon after a run when the next is
    /// far away.
    WakeAndSleep,
}

impl PredictPolicy {
    /// The name the configuration uses.
    pub fn as_str(self) -> &'static str {
        match self {
            PredictPolicy::Off => "off",
            PredictPolicy::Wake => "wake",
            PredictPolicy::WakeAndSleep => "wake_and_sleep",
        }
    }
}

/// Run starts remembered per tenant.
pub const HISTORY: usize = 16;
/// Intervals that must agree for a periodic pattern: after a change of period, the new one is
/// recognised on the third run at the new period.
pub const RECENT: usize = 3;
/// The fewest runs a pattern rests on: [`RECENT`] agreeing intervals.
pub const FEWEST_RUNS: usize = RECENT + 1;
/// Predicted runs that may pass without a run before the history stays silent.
pub const MAX_MISSES: u64 = 2;
/// How far a daily run's interval may stray from a whole number of days, and its start from the
/// usual time of day.
pub const DAILY_TOLERANCE: u64 = 20 * 60;
/// The largest floor of a pattern's window (a twentieth of the period below it), and a daily
/// run's floor: an hourly or nightly job that keeps to the second is not woken minutes early.
const FLOOR_CAP: u64 = 30;
/// How closely a periodic pattern on the fewest runs must keep to an evenly spaced schedule, as
/// a fraction of its period (1/30: a 15-minute job ± 30 s, an hourly one ± 2 min): three
/// intervals that agree only within a tenth are what random bursts of runs fake most often.
const FIRST_FIT: u64 = 30;
/// The smallest tolerance of a periodic pattern, for periods of a few seconds.
const MIN_TOLERANCE: u64 = 2;
const DAY: u64 = 86_400;
/// 1970-01-01 was a Thursday: the weekday (0 = Monday) of day 0.
const EPOCH_WEEKDAY: u64 = 3;

/// A recognised pattern of run starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Pattern {
    /// A run every `period` seconds; starts strayed by up to `jitter` seconds from the fit.
    Periodic {
        /// Seconds between runs.
        period: u64,
        /// How far a run may come from its predicted start, in seconds.
        jitter: u64,
        /// The predicted start after the newest run, on the schedule fitted to the runs.
        #[serde(skip)]
        anchor: u64,
    },
    /// A run a day, `at` seconds after midnight UTC, on the weekdays of `days` (bit 0 Monday).
    Daily {
        /// Seconds after midnight UTC.
        at: u64,
        /// Largest distance of a recent start from `at`, in seconds.
        jitter: u64,
        /// Weekdays that have had a run (bit 0 Monday … bit 6 Sunday).
        days: u8,
    },
}

impl Pattern {
    /// How far a run may come from its predicted time, in seconds.
    pub fn jitter(&self) -> u64 {
        match *self {
            Pattern::Periodic { jitter, .. } | Pattern::Daily { jitter, .. } => jitter,
        }
    }

    /// The predicted start after `t`, which is a predicted or actual start.
    fn after(self, t: u64) -> Option<u64> {
        match self {
            Pattern::Periodic {
                period,
                anchor: fit,
                ..
            } => {
                if fit > t {
                    Some(fit)
                } else {
                    // Whole periods past `t` on the fitted schedule.
                    let k = (t - fit) / period + 1;
                    Some(fit + k * period)
                }
            }
            Pattern::Daily { at, days, .. } => {
                let day = t / DAY;
                (1..=7)
                    .map(|d| day + d)
                    .find(|&d| days & (1 << weekday(d)) != 0)
                    .map(|d| d * DAY + at)
            }
        }
    }
}

/// A tenant's recent run starts: fixed memory, newest last.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunHistory {
    starts: [u64; HISTORY],
    len: usize,
    /// What the starts show and how many of the newest keep to it, worked out when they change:
    /// it is read every idle check.
    pattern: Option<(Pattern, usize)>,
}

impl RunHistory {
    /// A history holding `starts` (oldest first; only the last [`HISTORY`] are kept), e.g. as
    /// read back from a state file.
    pub fn from_starts(starts: &[u64]) -> RunHistory {
        let mut h = RunHistory::default();
        for &s in starts {
            h.push(s);
        }
        h.pattern = pattern_of(h.starts());
        h
    }

    /// The remembered starts, oldest first (what a state file keeps).
    pub fn starts(&self) -> &[u64] {
        &self.starts[..self.len]
    }

    /// A run started at `at`. A start earlier than the newest one (a clock step back) replaces
    /// the history, which cannot be trusted across it.
    pub fn record_run(&mut self, at: u64) {
        self.push(at);
        self.pattern = pattern_of(self.starts());
    }

    fn push(&mut self, at: u64) {
        if self.starts().last().is_some_and(|&last| at < last) {
            self.len = 0;
        }
        if self.len == HISTORY {
            self.starts.copy_within(1.., 0);
            self.len -= 1;
        }
        self.starts[self.len] = at;
        self.len += 1;
    }

    /// Takes in run starts another replica (or an earlier gateway) saw, oldest first: starts
    /// less than `gap` seconds after another are the same run, seen twice, and only the newest
    /// [`HISTORY`] are kept. Returns whether the history changed.
    pub fn merge(&mut self, other: &[u64], gap: u64) -> bool {
        let mut all: Vec<u64> = self.starts().iter().chain(other).copied().collect();
        all.sort_unstable();
        let mut runs: Vec<u64> = Vec::with_capacity(all.len());
        for s in all {
            if runs
                .last()
                .is_none_or(|&last| s >= last.saturating_add(gap.max(1)))
            {
                runs.push(s);
            }
        }
        let merged = RunHistory::from_starts(&runs);
        let changed = merged != *self;
        *self = merged;
        changed
    }

    /// The pattern the recent runs follow, if any.
    pub fn pattern(&self) -> Option<Pattern> {
        self.pattern.map(|(p, _)| p)
    }

    /// When the next run is expected, as seen at `now`: the first predicted start whose
    /// tolerance window has not passed yet. `None` without a pattern, or once [`MAX_MISSES`]
    /// predicted runs passed without a run (one, for a pattern on the fewest runs).
    pub fn next_run(&self, now: u64) -> Option<u64> {
        self.next_of(now)
    }

    /// When to start waking the tenant so that it is up by the next run: the run's earliest
    /// expected start less `lead` (the tenant's wake duration and a margin). `None` when no run
    /// is expected.
    pub fn wake_at(&self, now: u64, lead: Duration) -> Option<u64> {
        let pattern = self.pattern()?;
        let next = self.next_of(now)?;
        let lead = lead.as_secs() + u64::from(lead.subsec_nanos() > 0);
        Some(next.saturating_sub(pattern.jitter()).saturating_sub(lead))
    }

    /// Whether a tenant whose run just ended may sleep before its idle timeout: a run is
    /// expected, and its earliest start (less `lead`) is further away than `idle_timeout`.
    pub fn may_sleep_early(&self, now: u64, idle_timeout: Duration, lead: Duration) -> bool {
        self.wake_at(now, lead)
            .is_some_and(|wake| wake > now.saturating_add(idle_timeout.as_secs()))
    }

    fn last(&self) -> Option<u64> {
        self.starts().last().copied()
    }

    /// [`RunHistory::next_run`]. A pattern on the fewest runs whose first predicted run did not
    /// come was a false start: it predicts nothing more.
    fn next_of(&self, now: u64) -> Option<u64> {
        let (pattern, kept) = self.pattern?;
        let jitter = pattern.jitter();
        let max_misses = if kept <= FEWEST_RUNS { 1 } else { MAX_MISSES };
        let mut missed = 0;
        let mut next = pattern.after(self.last()?)?;
        while next.saturating_add(jitter) < now {
            missed += 1;
            if missed >= max_misses {
                return None;
            }
            next = pattern.after(next)?;
        }
        Some(next)
    }
}

/// The pattern `starts` (oldest first) follow, unless it rests on the fewest runs and the
/// starts hold a false start (see [`false_start`]).
fn pattern_of(starts: &[u64]) -> Option<(Pattern, usize)> {
    let (pattern, kept) = recognise(starts)?;
    if kept <= FEWEST_RUNS && false_start(starts) {
        return None;
    }
    Some((pattern, kept))
}

/// The pattern `starts` follow, and how many of the newest starts keep to it.
fn recognise(starts: &[u64]) -> Option<(Pattern, usize)> {
    daily(starts).or_else(|| periodic(starts))
}

/// Whether, at some earlier run, the runs before it showed a pattern that rested on the fewest
/// runs, and that run came outside the window the pattern predicted for it.
fn false_start(starts: &[u64]) -> bool {
    (FEWEST_RUNS..starts.len()).any(|end| {
        let before = &starts[..end];
        let Some((pattern, kept)) = recognise(before) else {
            return false;
        };
        let predicted = pattern.after(before[end - 1]);
        kept <= FEWEST_RUNS && predicted.is_none_or(|p| starts[end].abs_diff(p) > pattern.jitter())
    })
}

/// The newest `n` of `starts`.
fn recent_starts(starts: &[u64], n: usize) -> &[u64] {
    &starts[starts.len().saturating_sub(n)..]
}

/// A periodic pattern in `starts`, and how many of the newest keep to it.
fn periodic(starts: &[u64]) -> Option<(Pattern, usize)> {
    let recent = recent_starts(starts, FEWEST_RUNS);
    if recent.len() < FEWEST_RUNS {
        return None;
    }
    let mut intervals = [0u64; RECENT];
    for (i, w) in recent.windows(2).enumerate() {
        intervals[i] = w[1] - w[0];
    }
    intervals.sort_unstable();
    let median = intervals[intervals.len() / 2];
    if median == 0 {
        return None;
    }
    let tolerance = (median / 10).max(MIN_TOLERANCE);
    if intervals.iter().any(|&i| i.abs_diff(median) > tolerance) {
        return None;
    }
    // The period and the schedule are fitted to every earlier run that kept to it too, so
    // that one run's jitter moves neither much.
    let mut first = starts.len() - recent.len();
    while first > 0 && (starts[first] - starts[first - 1]).abs_diff(median) <= tolerance {
        first -= 1;
    }
    let kept = &starts[first..];
    if kept.len() <= FEWEST_RUNS && off_schedule(kept) > (median / FIRST_FIT).max(MIN_TOLERANCE) {
        return None;
    }
    let n = kept.len() as u64;
    let newest = *kept.last()?;
    let period = (newest - kept[0] + (n - 1) / 2) / (n - 1);
    // Each start carried forward to the one after the newest; their mean is the anchor.
    let carried = |i: usize, s: u64| s + (n - i as u64) * period;
    let sum: u64 = kept.iter().enumerate().map(|(i, &s)| carried(i, s)).sum();
    let anchor = sum / n;
    let spread = kept
        .iter()
        .enumerate()
        .map(|(i, &s)| carried(i, s).abs_diff(anchor))
        .max()
        .unwrap_or(0);
    // A few starts understate how far the next may stray: the window is their spread
    // widened (`widen`), and never under a twentieth of the period (or FLOOR_CAP).
    let floor = (period / 20).min(FLOOR_CAP);
    let jitter = widen(spread, n).max(floor).max(MIN_TOLERANCE);
    Some((
        Pattern::Periodic {
            period,
            jitter,
            anchor,
        },
        kept.len(),
    ))
}

/// A daily pattern in `starts`, and how many of the newest keep to it.
fn daily(starts: &[u64]) -> Option<(Pattern, usize)> {
    let recent = recent_starts(starts, RECENT + 2);
    if recent.len() < FEWEST_RUNS {
        return None;
    }
    let mut whole_days = 0;
    for w in recent.windows(2) {
        let interval = w[1] - w[0];
        let days = (interval + DAY / 2) / DAY;
        if !(1..=3).contains(&days) || interval.abs_diff(days * DAY) > DAILY_TOLERANCE {
            return None;
        }
        if days == 1 {
            whole_days += 1;
        }
    }
    if whole_days < RECENT - 1 {
        return None;
    }
    // Times of day, as offsets from the newest run's, so runs near midnight compare right.
    let newest = *recent.last()? % DAY;
    let offset = |s: u64| -> i64 {
        let d = (s % DAY) as i64 - newest as i64;
        (d + DAY as i64 / 2).rem_euclid(DAY as i64) - DAY as i64 / 2
    };
    // The time of day and its spread come from every earlier run that kept to the rhythm
    // too: a few starts place the time poorly and understate the spread.
    let mut first = starts.len() - recent.len();
    while first > 0 {
        let interval = starts[first] - starts[first - 1];
        let days = (interval + DAY / 2) / DAY;
        let kept = (1..=3).contains(&days)
            && interval.abs_diff(days * DAY) <= DAILY_TOLERANCE
            && offset(starts[first - 1]).unsigned_abs() <= DAILY_TOLERANCE;
        if !kept {
            break;
        }
        first -= 1;
    }
    let kept = &starts[first..];
    let mean = kept.iter().map(|&s| offset(s)).sum::<i64>() / kept.len() as i64;
    let spread = kept
        .iter()
        .map(|&s| offset(s).abs_diff(mean))
        .max()
        .unwrap_or(0);
    if spread > DAILY_TOLERANCE {
        return None;
    }
    let jitter = widen(spread, kept.len() as u64).max(FLOOR_CAP);
    let at = (newest as i64 + mean).rem_euclid(DAY as i64) as u64;
    // Runs on consecutive days so far: every day, until a skipped day shows which are not.
    let every_day = kept.windows(2).all(|w| (w[1] - w[0] + DAY / 2) / DAY == 1);
    let days = if every_day {
        0b111_1111
    } else {
        starts.iter().fold(0u8, |m, &s| m | 1 << weekday(s / DAY))
    };
    Some((Pattern::Daily { at, jitter, days }, kept.len()))
}

/// The largest distance in seconds of `starts` (oldest first, at least two) from the evenly
/// spaced schedule fitted to them by least squares.
fn off_schedule(starts: &[u64]) -> u64 {
    let n = starts.len() as f64;
    let x_mean = (n - 1.0) / 2.0;
    let y = |i: usize| (starts[i] - starts[0]) as f64;
    let y_mean = (0..starts.len()).map(y).sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for i in 0..starts.len() {
        let dx = i as f64 - x_mean;
        sxy += dx * (y(i) - y_mean);
        sxx += dx * dx;
    }
    let slope = sxy / sxx;
    (0..starts.len())
        .map(|i| (y(i) - y_mean - slope * (i as f64 - x_mean)).abs())
        .fold(0.0, f64::max)
        .round() as u64
}

/// How far runs may stray from their prediction, from the largest distance `spread` seen among
/// `n` starts: `n` starts see about (n - 1) / (n + 1) of the range they come from, and the
/// prediction (their mean) is itself off by about spread / √n.
fn widen(spread: u64, n: u64) -> u64 {
    let range = (spread * (n + 1)).div_ceil(n.saturating_sub(1).max(1));
    range + spread.div_ceil(n.isqrt().max(1))
}

/// The weekday of day `day` since the epoch, 0 = Monday.
fn weekday(day: u64) -> u64 {
    (day + EPOCH_WEEKDAY) % 7
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Monday, 2026-11-23 00:00 UTC.
    const MONDAY: u64 = 1_795_392_000;
    const MIN: u64 = 60;
    const HOUR: u64 = 3600;

    /// Jitter in -j..=j from a small deterministic generator.
    fn jitter(seed: &mut u64, j: u64) -> i64 {
        *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        ((*seed >> 33) % (2 * j + 1)) as i64 - j as i64
    }

    fn shifted(t: u64, by: i64) -> u64 {
        (t as i64 + by) as u64
    }

    #[test]
    fn the_monday_constant_is_a_monday() {
        assert_eq!(weekday(MONDAY / DAY), 0);
    }

    #[test]
    fn a_cron_job_every_fifteen_minutes_is_predicted_within_its_jitter() {
        let mut h = RunHistory::default();
        let mut seed = 7;
        let mut found = 0;
        for i in 0..40 {
            let at = shifted(MONDAY + i * 15 * MIN, jitter(&mut seed, 20));
            // Woken in time when the run came no earlier than its window opened; a later run
            // finds the tenant still up.
            if let Some(next) = h.next_run(at.saturating_sub(5 * MIN)) {
                let pattern = h.pattern().unwrap();
                if at + pattern.jitter() >= next && at <= next + 15 * MIN {
                    found += 1;
                }
            }
            h.record_run(at);
        }
        // Four runs before the first prediction; every later one predicted.
        assert!(found >= 40 - 4, "{found} of 40 predicted");
        assert!(matches!(
            h.pattern(),
            Some(Pattern::Periodic { period, .. }) if period.abs_diff(15 * MIN) <= 40
        ));
    }

    #[test]
    fn an_hourly_job_at_the_hour_predicts_the_next_hour() {
        let h =
            RunHistory::from_starts(&[MONDAY, MONDAY + HOUR, MONDAY + 2 * HOUR, MONDAY + 3 * HOUR]);
        assert_eq!(h.next_run(MONDAY + 3 * HOUR + 10), Some(MONDAY + 4 * HOUR));
        // Runs on the second: the window before it is the floor's cap, 30 s, not a twentieth of
        // the period.
        assert_eq!(
            h.wake_at(MONDAY + 3 * HOUR + 10, Duration::from_secs(30)),
            Some(MONDAY + 4 * HOUR - 30 - 30)
        );
    }

    #[test]
    fn irregular_runs_are_not_predicted() {
        let h = RunHistory::from_starts(&[MONDAY, MONDAY + 300, MONDAY + 2000, MONDAY + 2300]);
        assert_eq!(h.pattern(), None);
        assert_eq!(h.next_run(MONDAY + 2400), None);
        assert!(!h.may_sleep_early(MONDAY + 2400, Duration::from_secs(60), Duration::ZERO));
    }

    #[test]
    fn three_runs_are_not_enough() {
        let h = RunHistory::from_starts(&[MONDAY, MONDAY + 600, MONDAY + 1200]);
        assert_eq!(h.pattern(), None);
    }

    #[test]
    fn a_changed_period_is_followed_within_three_runs() {
        let mut h = RunHistory::default();
        for i in 0..8 {
            h.record_run(MONDAY + i * 10 * MIN);
        }
        let mut t = MONDAY + 7 * 10 * MIN;
        let mut right = Vec::new();
        for _ in 0..5 {
            t += 25 * MIN;
            right.push(h.next_run(t - MIN) == Some(t));
            h.record_run(t);
        }
        // Runs 1–3 at the new period may be missed; from the fourth on it is predicted.
        assert_eq!(right[3..], [true, true], "{right:?}");
    }

    #[test]
    fn predictions_stop_after_two_missed_runs() {
        let hourly: Vec<u64> = (0..5).map(|k| MONDAY + k * HOUR).collect();
        let h = RunHistory::from_starts(&hourly);
        // The run at +5 h did not come: +6 h is still expected.
        assert_eq!(
            h.next_run(MONDAY + 5 * HOUR + 10 * MIN),
            Some(MONDAY + 6 * HOUR)
        );
        // Neither did +6 h: silence.
        assert_eq!(h.next_run(MONDAY + 6 * HOUR + 10 * MIN), None);
        assert!(h.pattern().is_some());
        // Runs come again: predictions resume once four agree.
        let mut h = h;
        for k in 9..13 {
            h.record_run(MONDAY + k * HOUR);
        }
        assert_eq!(
            h.next_run(MONDAY + 12 * HOUR + MIN),
            Some(MONDAY + 13 * HOUR)
        );
    }

    #[test]
    fn a_pattern_on_four_runs_stops_after_one_missed_run() {
        let h =
            RunHistory::from_starts(&[MONDAY, MONDAY + HOUR, MONDAY + 2 * HOUR, MONDAY + 3 * HOUR]);
        assert_eq!(h.next_run(MONDAY + 3 * HOUR + 1), Some(MONDAY + 4 * HOUR));
        // The run at +4 h did not come: a false start, silent from then on.
        assert_eq!(h.next_run(MONDAY + 4 * HOUR + 10 * MIN), None);
        // Runs come again: the false start is remembered, so four agreeing runs are not enough,
        // five are.
        let mut h = h;
        for k in 9..13 {
            h.record_run(MONDAY + k * HOUR);
        }
        assert_eq!(h.pattern(), None);
        h.record_run(MONDAY + 13 * HOUR);
        assert_eq!(
            h.next_run(MONDAY + 13 * HOUR + MIN),
            Some(MONDAY + 14 * HOUR)
        );
    }

    #[test]
    fn four_runs_that_drift_within_a_tenth_are_no_pattern() {
        // Intervals of 9, 10 and 11 minutes agree within a tenth of their median, but the runs
        // lie 30 s off an even schedule, more than a thirtieth of ten minutes.
        assert_eq!(off_schedule(&[0, 540, 1140, 1800]), 30);
        let h = RunHistory::from_starts(&[MONDAY, MONDAY + 540, MONDAY + 1140, MONDAY + 1800]);
        assert_eq!(h.pattern(), None);
        let h = RunHistory::from_starts(&[MONDAY, MONDAY + 610, MONDAY + 1190, MONDAY + 1805]);
        assert!(h.pattern().is_some());
        // A fifth run that keeps to the period is enough evidence for the looser agreement.
        let h = RunHistory::from_starts(&[
            MONDAY,
            MONDAY + 540,
            MONDAY + 1140,
            MONDAY + 1800,
            MONDAY + 2400,
        ]);
        assert!(h.pattern().is_some());
    }

    #[test]
    fn after_a_false_start_a_pattern_needs_one_more_run() {
        // Four runs ten minutes apart, then none for an hour: a pattern on the fewest runs whose
        // first prediction no run kept.
        let burst = [MONDAY, MONDAY + 600, MONDAY + 1200, MONDAY + 1800];
        let mut h = RunHistory::from_starts(&burst);
        assert!(h.pattern().is_some());
        let later: Vec<u64> = (0..4).map(|k| MONDAY + 2 * HOUR + k * 420).collect();
        for &s in &later {
            h.record_run(s);
        }
        // Another four agreeing runs are not enough while the false start is remembered ...
        assert_eq!(h.pattern(), None);
        // ... five are.
        h.record_run(MONDAY + 2 * HOUR + 4 * 420);
        assert!(matches!(
            h.pattern(),
            Some(Pattern::Periodic { period: 420, .. })
        ));
        // Without the false start, four are.
        assert!(RunHistory::from_starts(&later).pattern().is_some());
        // A pattern on more runs that then changes is no false start: the new period is
        // followed from four runs.
        let mut steady: Vec<u64> = (0..8).map(|k| MONDAY + k * 600).collect();
        let turn = *steady.last().unwrap();
        steady.extend((1..=3).map(|k| turn + k * 1500));
        let h = RunHistory::from_starts(&steady);
        assert!(matches!(
            h.pattern(),
            Some(Pattern::Periodic { period: 1500, .. })
        ));
    }

    #[test]
    fn a_false_start_is_forgotten_with_the_runs_that_made_it() {
        let mut h = RunHistory::from_starts(&[MONDAY, MONDAY + 600, MONDAY + 1200, MONDAY + 1800]);
        // Runs an hour or more apart, none agreeing, until the false start has left the history.
        let mut t = MONDAY + 2 * HOUR;
        for k in 0..HISTORY as u64 - 4 {
            t += if k % 2 == 0 { HOUR } else { 5 * HOUR / 2 };
            h.record_run(t);
        }
        for k in 1..=3 {
            h.record_run(t + k * 900);
        }
        assert!(h.pattern().is_some(), "{:?}", h.starts());
    }

    #[test]
    fn weekday_mornings_skip_the_weekend() {
        let mut h = RunHistory::default();
        let mut seed = 3;
        // Two weeks of runs at 08:00 ± 5 min, Monday to Friday.
        for week in 0..2 {
            for day in 0..5 {
                let at = MONDAY + (week * 7 + day) * DAY + 8 * HOUR;
                h.record_run(shifted(at, jitter(&mut seed, 5 * MIN)));
            }
        }
        let friday = MONDAY + 11 * DAY + 8 * HOUR;
        let Some(Pattern::Daily { at, days, .. }) = h.pattern() else {
            panic!("{:?}", h.pattern());
        };
        assert!(at.abs_diff(8 * HOUR) <= 5 * MIN, "{at}");
        assert_eq!(days, 0b0001_1111);
        // After Friday's run the next is Monday's, not Saturday's.
        let next = h.next_run(friday + HOUR).unwrap();
        assert_eq!(next / DAY, MONDAY / DAY + 14);
        assert!(h.may_sleep_early(
            friday + HOUR,
            Duration::from_secs(300),
            Duration::from_secs(60)
        ));
    }

    #[test]
    fn a_daily_run_near_midnight_keeps_its_time_of_day() {
        let starts: Vec<u64> = [-3i64 * 60, 2 * 60, -60, 4 * 60]
            .iter()
            .enumerate()
            .map(|(d, &off)| shifted(MONDAY + (d as u64 + 1) * DAY, off))
            .collect();
        let h = RunHistory::from_starts(&starts);
        let Some(Pattern::Daily { at, .. }) = h.pattern() else {
            panic!("{:?}", h.pattern());
        };
        assert!(!(5 * MIN..=DAY - 5 * MIN).contains(&at), "{at}");
    }

    #[test]
    fn a_clock_step_back_forgets_the_history() {
        let mut h =
            RunHistory::from_starts(&[MONDAY, MONDAY + HOUR, MONDAY + 2 * HOUR, MONDAY + 3 * HOUR]);
        h.record_run(MONDAY + HOUR / 2);
        assert_eq!(h.starts(), &[MONDAY + HOUR / 2]);
    }

    #[test]
    fn histories_of_two_replicas_merge_into_one_list_of_runs() {
        // Both saw the run at +1 h (a few seconds apart); each saw one the other did not.
        let mut a = RunHistory::from_starts(&[MONDAY, MONDAY + HOUR, MONDAY + 3 * HOUR]);
        let b = [MONDAY + HOUR + 4, MONDAY + 2 * HOUR];
        assert!(a.merge(&b, 60));
        assert_eq!(
            a.starts(),
            &[MONDAY, MONDAY + HOUR, MONDAY + 2 * HOUR, MONDAY + 3 * HOUR]
        );
        assert_eq!(a.next_run(MONDAY + 3 * HOUR + 1), Some(MONDAY + 4 * HOUR));
        // Nothing new: unchanged.
        assert!(!a.merge(&b, 60));
        // Only the newest runs are kept.
        let many: Vec<u64> = (0..40).map(|i| MONDAY + 5 * HOUR + i * MIN).collect();
        a.merge(&many, 1);
        assert_eq!(a.starts(), &many[40 - HISTORY..]);
    }

    #[test]
    fn the_history_keeps_its_last_runs_only() {
        let starts: Vec<u64> = (0..40).map(|i| MONDAY + i * MIN).collect();
        let h = RunHistory::from_starts(&starts);
        assert_eq!(h.starts(), &starts[40 - HISTORY..]);
    }

    #[test]
    fn poisson_runs_rarely_look_periodic() {
        // Exponential gaps with a mean of 20 minutes: a prediction that a run then misses by
        // more than the jitter is a wasted pre-wake.
        let mut seed: u64 = 11;
        let mut uniform = || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            ((seed >> 11) as f64 + 1.0) / (1u64 << 53) as f64
        };
        let mut h = RunHistory::default();
        let mut t = MONDAY;
        let mut wasted = 0;
        let runs = 10_000;
        for _ in 0..runs {
            let gap = (-uniform().ln() * 20.0 * MIN as f64) as u64 + 1;
            let next = t + gap;
            if let (Some(p), Some(pred)) = (h.pattern(), h.next_run(t + 1))
                && pred.abs_diff(next) > p.jitter()
            {
                wasted += 1;
            }
            h.record_run(next);
            t = next;
        }
        assert!(
            wasted * 100 <= runs,
            "{wasted} wasted predictions in {runs} runs"
        );
    }
}
