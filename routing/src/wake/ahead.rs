//! Predictive wake and sleep: the scheduler ([`LookAhead`]) the coordinator owns, and what it
//! does with each tenant's run history. It sees the coordinator only through [`WakeStarter`]:
//! the tenants' slots, and starting a wake through the same single flight a connection uses.
//!
//! Every client connection that arrives after a sleep, or after [`PredictSettings::run_gap`]
//! without one, starts a run; its start goes into the tenant's [`RunHistory`] whatever the
//! tenant's policy, so the status page shows a pattern before anyone opts in. For tenants that
//! opt in ([`PredictPolicy`]):
//!
//! - the look-ahead loop wakes an asleep tenant ahead of its predicted run, by the run's window,
//!   its slowest recent wake and [`PredictSettings::margin`], through the same single-flight
//!   wake a connection starts; until the window has passed the tenant is not put to sleep, and
//!   then the ordinary idle timeout applies;
//! - with `wake_and_sleep`, once a run is over and the next is predicted further away than the
//!   idle timeout, the tenant sleeps after [`PredictSettings::sleep_grace`] instead.
//!
//! Histories outlive the gateway in [`PredictSettings::history_file`]; replicas sharing a tenant
//! also merge theirs through its shared activity record ([`crate::activity`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::forecast::{Clock, ForecastTimings, PreWake, PredictionCounts};
use super::slot::{Inner, Slot};
use super::{Phase, PredictSettings, WakeSettings};
use crate::TenantId;
use crate::predict::{Pattern, PredictPolicy, RunHistory};
use crate::private_file;

/// What the scheduler needs of the coordinator that owns it.
pub(super) trait WakeStarter {
    /// Every tenant's slot, as the coordinator holds them now.
    fn slots(&self) -> Vec<Arc<Slot>>;
    /// Starts a wake of the tenant through the coordinator's single flight; the caller holds
    /// the slot's lock.
    fn start(&self, slot: &Arc<Slot>, inner: &mut Inner);
}

/// The scheduler of predictive wakes: the clock predictions read, run histories not yet in a
/// slot and the history file, the gateway's totals, and the look-ahead loop.
pub(super) struct LookAhead {
    settings: PredictSettings,
    /// How often the loop looks ahead (the idle check's interval).
    interval: Duration,
    clock: Clock,
    histories: Histories,
    counts: PredictionCounts,
}

/// The run histories of a history file.
#[derive(Default, Deserialize, Serialize)]
struct HistoryFile {
    /// Run starts per tenant, seconds since the epoch, oldest first.
    tenants: HashMap<String, Vec<u64>>,
}

/// Reads the run histories kept in `path` for the tenants `configured` says are configured; a
/// missing file holds none, and one that cannot be read (larger than `max_bytes`, or a link)
/// is logged and left to be rewritten.
fn load_histories(
    path: Option<&Path>,
    max_bytes: u64,
    configured: impl Fn(&TenantId) -> bool,
) -> HashMap<TenantId, RunHistory> {
    let Some(path) = path else {
        return HashMap::new();
    };
    let text = match private_file::read_at_most(path, max_bytes) {
        Ok(Some(text)) => text,
        Ok(None) => return HashMap::new(),
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            warn!(path = %path.display(), error = %e, "the run histories file is larger than wake.predict_history_max_size; starting without it");
            return HashMap::new();
        }
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot read the run histories; starting without them");
            return HashMap::new();
        }
    };
    match serde_json::from_slice::<HistoryFile>(&text) {
        Ok(file) => file
            .tenants
            .into_iter()
            .filter_map(|(id, starts)| {
                let id = TenantId::parse(&id).ok().filter(&configured)?;
                Some((id, RunHistory::from_starts(&starts)))
            })
            .collect(),
        Err(e) => {
            warn!(path = %path.display(), error = %e, "the run histories file is not valid; starting without it");
            HashMap::new()
        }
    }
}

/// Writes the histories to `path` through a temporary file of a fresh name, so a crash never
/// leaves half a file and no link planted beside it receives the text; a text over
/// `max_bytes` is not written.
fn save_histories(
    path: &Path,
    histories: HashMap<String, Vec<u64>>,
    max_bytes: u64,
) -> std::io::Result<()> {
    let text =
        serde_json::to_vec(&HistoryFile { tenants: histories }).map_err(std::io::Error::other)?;
    if text.len() as u64 > max_bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "{} bytes of run histories, more than wake.predict_history_max_size ({max_bytes})",
                text.len()
            ),
        ));
    }
    private_file::replace(path, &text)
}

/// Run histories not (yet) in a slot, and whether any changed since they were last saved.
#[derive(Default)]
struct Histories {
    /// Read from the history file, for tenants that have no slot yet.
    unclaimed: std::sync::Mutex<HashMap<TenantId, RunHistory>>,
    dirty: AtomicBool,
    /// The last write failed: the next failure is not warned about again until one succeeds.
    failing: AtomicBool,
}

impl LookAhead {
    /// A scheduler with the histories of the history file for the tenants `configured` says
    /// are configured.
    pub(super) fn new(
        settings: &WakeSettings,
        configured: impl Fn(&TenantId) -> bool,
    ) -> LookAhead {
        let predict = &settings.predict;
        let unclaimed = load_histories(
            predict.history_file.as_deref(),
            predict.history_max_bytes,
            configured,
        );
        LookAhead {
            settings: predict.clone(),
            interval: settings.idle_check_interval,
            clock: Clock::start(),
            histories: Histories {
                unclaimed: std::sync::Mutex::new(unclaimed),
                ..Histories::default()
            },
            counts: PredictionCounts::default(),
        }
    }

    /// What a new slot copies of the settings, with this scheduler's clock.
    pub(super) fn timings(&self) -> ForecastTimings {
        ForecastTimings::new(&self.settings, self.clock)
    }

    /// The history read for a tenant that gets its first slot (empty when none was kept).
    pub(super) fn take_history(&self, tenant: &TenantId) -> RunHistory {
        self.histories
            .unclaimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(tenant)
            .unwrap_or_default()
    }

    /// Takes in run starts other replicas saw (from the tenant's shared activity record).
    pub(super) fn take_runs(&self, inner: &mut Inner, runs: &[u64]) {
        let gap = self.settings.run_gap.as_secs();
        if inner.forecast.history.merge(runs, gap) {
            self.histories.dirty.store(true, Ordering::Relaxed);
        }
    }

    /// Notes a client connection arriving at the tenant; the caller holds the slot's lock.
    pub(super) fn note_arrival(&self, slot: &Slot, inner: &mut Inner) {
        let now = Instant::now();
        let quiet = inner.connections == 0 && inner.waiters == 0;
        let gap = inner
            .forecast
            .last_client
            .is_none_or(|t| now.duration_since(t) >= self.settings.run_gap);
        let slept = !matches!(inner.phase, Phase::Awake | Phase::Waking);
        // The first client after a wake ahead of a predicted run is that run, however soon
        // after the last one it comes: the tenant is up only because of the prediction.
        let predicted = inner.forecast.prewake.is_some();
        inner.forecast.last_client = Some(now);
        if !quiet || !(gap || slept || predicted) {
            return;
        }
        let awake = inner.phase == Phase::Awake;
        let f = &mut inner.forecast;
        f.history.record_run(slot.timings.clock.seconds());
        f.counts.seen += 1;
        let counts = &self.counts;
        if awake {
            f.counts.found_awake += 1;
            counts.runs_found_awake.fetch_add(1, Ordering::Relaxed);
        } else {
            counts.runs_found_asleep.fetch_add(1, Ordering::Relaxed);
        }
        if f.prewake.take().is_some() {
            f.counts.prewakes_used += 1;
            counts.prewakes_used.fetch_add(1, Ordering::Relaxed);
        }
        self.histories.dirty.store(true, Ordering::Relaxed);
    }

    /// Wakes tenants ahead of their predicted runs and closes the windows of runs that did not
    /// come, every `idle_check_interval`; keeps the history file up to date. Runs until `stop`
    /// fires (the gateway began to shut down: nothing is woken ahead any more).
    pub(super) async fn run(&self, coordinator: &impl WakeStarter, stop: &CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = sleep(self.interval) => {}
            }
            let slots = coordinator.slots();
            for slot in &slots {
                if slot.tenant.predict != PredictPolicy::Off {
                    self.look_ahead_at(coordinator, slot);
                }
            }
            self.save_if_changed(&coordinator.slots()).await;
        }
        self.save_if_changed(&coordinator.slots()).await;
    }

    fn look_ahead_at(&self, coordinator: &impl WakeStarter, slot: &Arc<Slot>) {
        let id = &slot.tenant.id;
        let mut inner = slot.lock();
        let now = slot.timings.clock.seconds();
        if let Some(prewake) = inner.forecast.prewake
            && now > prewake.until
        {
            inner.forecast.prewake = None;
            // A run that reached another replica is in the history once the shared record
            // brought it here.
            let came = inner
                .forecast
                .history
                .starts()
                .last()
                .is_some_and(|&s| s >= prewake.since);
            if came {
                inner.forecast.counts.prewakes_used += 1;
                self.counts.prewakes_used.fetch_add(1, Ordering::Relaxed);
            } else {
                info!(tenant = %id, "the predicted run did not come: the tenant sleeps after its idle timeout");
                inner.forecast.counts.prewakes_wasted += 1;
                self.counts.prewakes_wasted.fetch_add(1, Ordering::Relaxed);
            }
        }
        if inner.phase != Phase::Asleep
            || inner.connections > 0
            || inner.waiters > 0
            || inner.forecast.prewake.is_some()
        {
            return;
        }
        let lead = slot.lead(&inner);
        let history = &inner.forecast.history;
        let (Some(pattern), Some(run)) = (history.pattern(), history.next_run(now)) else {
            return;
        };
        // Runs closer together than the idle timeout keep the tenant up between them: there is
        // nothing to wake ahead of, and such a period is what random bursts fake most often.
        if let Pattern::Periodic { period, .. } = pattern
            && Duration::from_secs(period) <= slot.tenant.idle_timeout
        {
            return;
        }
        let Some(wake_at) = history.wake_at(now, lead) else {
            return;
        };
        if now < wake_at {
            return;
        }
        info!(tenant = %id, run_in_s = run.saturating_sub(now), "waking ahead of the predicted run");
        inner.forecast.prewake = Some(PreWake {
            since: now,
            until: run + pattern.jitter(),
        });
        coordinator.start(slot, &mut inner);
    }

    /// Writes the history file when a history changed since the last write.
    async fn save_if_changed(&self, slots: &[Arc<Slot>]) {
        let Some(path) = self.settings.history_file.clone() else {
            return;
        };
        if !self.histories.dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        let mut all: HashMap<String, Vec<u64>> = self
            .histories
            .unclaimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, h)| (id.to_string(), h.starts().to_vec()))
            .collect();
        for slot in slots {
            let inner = slot.lock();
            let starts = inner.forecast.history.starts();
            if !starts.is_empty() {
                all.insert(slot.tenant.id.to_string(), starts.to_vec());
            }
        }
        let max_bytes = self.settings.history_max_bytes;
        let written = tokio::task::spawn_blocking({
            let path = path.clone();
            move || save_histories(&path, all, max_bytes)
        })
        .await;
        match written {
            Ok(Err(e)) => {
                if !self.histories.failing.swap(true, Ordering::Relaxed) {
                    warn!(path = %path.display(), error = %e, "cannot write the run histories; retrying quietly until it works");
                }
                self.histories.dirty.store(true, Ordering::Relaxed);
            }
            Ok(Ok(())) => {
                if self.histories.failing.swap(false, Ordering::Relaxed) {
                    info!(path = %path.display(), "the run histories are written again");
                }
            }
            Err(_) => self.histories.dirty.store(true, Ordering::Relaxed),
        }
    }

    /// Seconds since the Unix epoch on the clock the run predictions read.
    pub(super) fn clock_seconds(&self) -> u64 {
        self.clock.seconds()
    }

    /// The gateway's totals of runs and predictions.
    pub(super) fn counts(&self) -> &PredictionCounts {
        &self.counts
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::testing::*;
    use super::*;

    const PERIOD: Duration = Duration::from_secs(600);
    const RUN: Duration = Duration::from_secs(30);

    /// A lab of one tenant with the given policy: every wake takes a second, the idle timeout is
    /// five minutes (so the tenant sleeps between runs ten minutes apart).
    fn lab(
        predict: PredictPolicy,
        history_file: Option<PathBuf>,
    ) -> (Lab, TenantId, Arc<FakeBackend>) {
        let t = tenant("t");
        let backend = fake(FakeBackend::new());
        let settings = WakeSettings {
            predict: PredictSettings {
                history_file,
                ..PredictSettings::default()
            },
            ..settings()
        };
        let lab = Lab::predicting(settings, 300 * SECOND, predict, &[(&t, &backend)]);
        (lab, t, backend)
    }

    /// A run at `at`: one connection, held for [`RUN`]; returns whether it found the tenant
    /// awake.
    async fn run_at(lab: &Lab, t: &TenantId, at: Instant) -> bool {
        tokio::time::sleep_until(at).await;
        let awake = lab.coordinator.is_awake(t);
        let admission = lab.coordinator.ensure_awake(t).await.unwrap();
        sleep(RUN).await;
        drop(admission);
        awake
    }

    /// When the tenant went to sleep after `from`, as the fake saw it.
    fn sleeps_after(backend: &FakeBackend, from: Instant) -> Vec<Duration> {
        backend
            .times_of(Call::Sleep)
            .into_iter()
            .filter(|t| *t >= from)
            .map(|t| t - from)
            .collect()
    }

    /// A tenant used for two seconds every thirty, which sleeps after ten idle ones: its period
    /// is shorter than `run_gap` (45 s), so only the sleeps between its uses start its runs.
    #[tokio::test(start_paused = true)]
    async fn a_run_sooner_than_the_run_gap_after_a_pre_wake_is_the_predicted_run() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new());
        let lab = Lab::predicting(
            settings(),
            10 * SECOND,
            PredictPolicy::Wake,
            &[(&t, &backend)],
        );
        let _sleeper = lab.run_idle_sleeper();
        let start = Instant::now();
        let mut found_awake = Vec::new();
        for k in 0..6 {
            tokio::time::sleep_until(start + k * 30 * SECOND).await;
            found_awake.push(lab.coordinator.is_awake(&t));
            let admission = lab.coordinator.ensure_awake(&t).await.unwrap();
            sleep(2 * SECOND).await;
            drop(admission);
        }
        sleep(30 * SECOND).await;
        let runs = lab.status(&t).runs;
        println!("found awake {found_awake:?}; {runs:?}");
        assert_eq!(found_awake, [false, false, false, false, true, true]);
        assert_eq!(
            (runs.seen, runs.prewakes_used, runs.prewakes_wasted),
            (6, 2, 0),
            "each pre-woken run counts as the run it predicted"
        );
    }

    /// A tenant that stays up (idle timeout five minutes) used for two seconds at a period,
    /// each use a second early or late in turn, as a scheduler's start times stray; returns the
    /// runs its status counts.
    async fn runs_of_a_period_that_strays(period: Duration, uses: u32) -> crate::wake::RunStatus {
        let t = tenant("t");
        let backend = fake(FakeBackend::new());
        let lab = Lab::predicting(
            settings(),
            300 * SECOND,
            PredictPolicy::Wake,
            &[(&t, &backend)],
        );
        let _sleeper = lab.run_idle_sleeper();
        let start = Instant::now() + SECOND;
        for k in 0..uses {
            let on_time = start + k * period;
            let at = if k % 2 == 0 {
                on_time - SECOND
            } else {
                on_time + SECOND
            };
            tokio::time::sleep_until(at).await;
            let admission = lab.coordinator.ensure_awake(&t).await.unwrap();
            sleep(2 * SECOND).await;
            drop(admission);
        }
        assert_eq!(backend.wakes().len(), 1, "the tenant stayed up");
        lab.status(&t).runs
    }

    /// A once-a-minute cron whose start strays by a second: with the default run gap every use
    /// is a run (a gap of exactly a minute counted every other one), and its pattern is found.
    #[tokio::test(start_paused = true)]
    async fn every_start_of_a_once_a_minute_cron_is_a_run() {
        let runs = runs_of_a_period_that_strays(60 * SECOND, 8).await;
        println!("{runs:?}");
        assert_eq!(runs.seen, 8, "every use of the cron starts a run");
        assert!(
            matches!(runs.pattern, Some(Pattern::Periodic { period: 60, .. })),
            "{runs:?}"
        );
    }

    /// Uses every thirty seconds, straying by a second, are one run: they are closer than the
    /// default run gap with room to spare.
    #[tokio::test(start_paused = true)]
    async fn uses_every_half_minute_are_one_run() {
        let runs = runs_of_a_period_that_strays(30 * SECOND, 8).await;
        assert_eq!(runs.seen, 1, "{runs:?}");
    }

    /// The gateway starts to drain (SIGINT) while its idle sleeper still runs: the tenant whose
    /// next run is predicted is not woken ahead, as nobody could reach it.
    #[tokio::test(start_paused = true)]
    async fn no_tenant_is_woken_ahead_once_the_gateway_drains() {
        let (lab, t, backend) = lab(PredictPolicy::Wake, None);
        let draining = tokio_util::sync::CancellationToken::new();
        let _sleeper = lab.run_idle_sleeper_until_draining(draining.clone());
        let start = Instant::now();
        for k in 0..4 {
            run_at(&lab, &t, start + k * PERIOD).await;
        }
        assert!(lab.status(&t).runs.next_run.is_some(), "a pattern is known");
        tokio::time::sleep_until(start + 3 * PERIOD + PERIOD / 2).await;
        draining.cancel();
        tokio::time::sleep_until(start + 4 * PERIOD + PERIOD / 2).await;
        assert_eq!(
            backend.wakes().len(),
            4,
            "no wake ahead after the drain began"
        );
        assert!(!lab.coordinator.is_awake(&t));
    }

    #[tokio::test(start_paused = true)]
    async fn a_periodic_tenant_is_woken_ahead_of_its_next_run() {
        let (lab, t, backend) = lab(PredictPolicy::Wake, None);
        let _sleeper = lab.run_idle_sleeper();
        let start = Instant::now();
        let epoch = lab.coordinator.clock_seconds();
        // Four runs make three equal intervals: the pattern is known after the fourth.
        for k in 0..4 {
            assert!(
                !run_at(&lab, &t, start + k * PERIOD).await,
                "run {k} found it awake"
            );
        }
        let runs = lab.status(&t).runs;
        assert!(
            matches!(runs.pattern, Some(Pattern::Periodic { period: 600, .. })),
            "{runs:?}"
        );
        let next = runs.next_run.expect("a next run") as u64;
        assert!(next.abs_diff(epoch + 4 * 600) <= 1, "{next} for {epoch}");
        assert!(
            run_at(&lab, &t, start + 4 * PERIOD).await,
            "the fifth run waited for a wake"
        );
        let wakes = backend.wakes();
        assert_eq!(wakes.len(), 5);
        // Ahead by the jitter window (a twentieth of the period), the wake and the margin.
        let ahead = start + 4 * PERIOD - wakes[4];
        assert!(ahead >= 30 * SECOND && ahead <= 35 * SECOND, "{ahead:?}");
        let runs = lab.status(&t).runs;
        assert_eq!(
            (
                runs.seen,
                runs.found_awake,
                runs.prewakes_used,
                runs.prewakes_wasted
            ),
            (5, 1, 1, 0)
        );
        // Without wake_and_sleep, the tenant still sleeps after its full idle timeout.
        sleep(400 * SECOND).await;
        let after_run = sleeps_after(&backend, start + 4 * PERIOD + RUN);
        assert_eq!(after_run.len(), 1);
        assert!(after_run[0] >= 300 * SECOND, "{after_run:?}");
        let counts = lab.coordinator.prediction_counts();
        assert_eq!(counts.prewakes_used.load(Ordering::Relaxed), 1);
        assert_eq!(counts.runs_found_awake.load(Ordering::Relaxed), 1);
        assert_eq!(counts.runs_found_asleep.load(Ordering::Relaxed), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn with_wake_and_sleep_the_tenant_sleeps_soon_after_a_run_when_the_next_is_far() {
        let (lab, t, backend) = lab(PredictPolicy::WakeAndSleep, None);
        let _sleeper = lab.run_idle_sleeper();
        let start = Instant::now();
        for k in 0..3 {
            run_at(&lab, &t, start + k * PERIOD).await;
        }
        run_at(&lab, &t, start + 3 * PERIOD).await;
        // Not known before the fourth run: the third ended with the full idle timeout.
        let after_third = sleeps_after(&backend, start + 2 * PERIOD + RUN);
        assert!(after_third[0] >= 300 * SECOND, "{after_third:?}");
        // Known now: the grace (15 s) and the next look after it.
        sleep(60 * SECOND).await;
        let after_fourth = sleeps_after(&backend, start + 3 * PERIOD + RUN);
        assert_eq!(after_fourth.len(), 1);
        assert!(
            after_fourth[0] >= 15 * SECOND && after_fourth[0] <= 17 * SECOND,
            "{after_fourth:?}"
        );
        assert!(run_at(&lab, &t, start + 4 * PERIOD).await);
        let runs = lab.status(&t).runs;
        assert_eq!((runs.predictive_sleeps, runs.prewakes_used), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_session_counts_as_idle_after_the_grace_once_the_next_run_is_far() {
        let (lab, t, _backend) = lab(PredictPolicy::WakeAndSleep, None);
        let start = Instant::now();
        for k in 0..3 {
            run_at(&lab, &t, start + k * PERIOD).await;
        }
        tokio::time::sleep_until(start + 3 * PERIOD).await;
        let admission = lab.coordinator.ensure_awake(&t).await.unwrap();
        assert_eq!(admission.claim.idle_timeout(), 15 * SECOND);
        let (off, t_off, _) = lab_off();
        let other = off.coordinator.ensure_awake(&t_off).await.unwrap();
        assert_eq!(other.claim.idle_timeout(), 300 * SECOND);
    }

    fn lab_off() -> (Lab, TenantId, Arc<FakeBackend>) {
        lab(PredictPolicy::Off, None)
    }

    #[tokio::test(start_paused = true)]
    async fn pre_wakes_for_runs_that_do_not_come_stop_after_two() {
        let (lab, t, backend) = lab(PredictPolicy::Wake, None);
        let _sleeper = lab.run_idle_sleeper();
        let start = Instant::now();
        for k in 0..5 {
            run_at(&lab, &t, start + k * PERIOD).await;
        }
        // The tenant stops: two predicted runs pass, then nothing for a long time.
        sleep(20 * PERIOD).await;
        assert_eq!(backend.wakes().len(), 5 + 2);
        let runs = lab.status(&t).runs;
        // The fifth run used the pre-wake the first four predicted.
        assert_eq!((runs.prewakes_used, runs.prewakes_wasted), (1, 2));
        assert_eq!(runs.next_run, None);
        assert_eq!(lab.status(&t).state, Phase::Asleep);
        // A run brings the tenant back; a new pattern needs new runs.
        assert!(!run_at(&lab, &t, Instant::now()).await);
        sleep(2 * PERIOD).await;
        assert_eq!(backend.wakes().len(), 5 + 2 + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn irregular_runs_wake_nothing_ahead() {
        let (lab, t, backend) = lab(PredictPolicy::WakeAndSleep, None);
        let _sleeper = lab.run_idle_sleeper();
        let start = Instant::now();
        let gaps = [700, 1900, 650, 3100, 1200, 800, 2500];
        let mut at = start;
        for gap in gaps {
            run_at(&lab, &t, at).await;
            at += gap * SECOND;
        }
        assert_eq!(backend.wakes().len(), gaps.len());
        let runs = lab.status(&t).runs;
        assert_eq!(runs.pattern, None);
        assert_eq!(
            (
                runs.prewakes_used,
                runs.prewakes_wasted,
                runs.predictive_sleeps
            ),
            (0, 0, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn connections_of_one_run_start_it_once() {
        let (lab, t, _backend) = lab(PredictPolicy::Wake, None);
        let together = join_all((0..10).map(|_| lab.coordinator.ensure_awake(&t))).await;
        drop(together);
        // Within the run gap of the last one: the same run.
        sleep(30 * SECOND).await;
        let again = lab.coordinator.ensure_awake(&t).await.unwrap();
        drop(again);
        // The admin API's wake is not a client's run.
        lab.coordinator.sleep(&t).await.unwrap();
        sleep(120 * SECOND).await;
        lab.coordinator.wake(&t).await.unwrap();
        assert_eq!(lab.status(&t).runs.seen, 1);
        // After a sleep, or after the run gap, a connection starts the next one.
        sleep(120 * SECOND).await;
        drop(lab.coordinator.ensure_awake(&t).await.unwrap());
        assert_eq!(lab.status(&t).runs.seen, 2);
    }

    #[test]
    fn only_configured_tenants_histories_are_loaded_and_never_from_a_file_over_the_cap() {
        let dir = std::env::temp_dir().join(format!("pgwake-runs-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("runs.json");
        let text = r#"{"tenants":{"t":[600,1200,1800],"ghost":[600,1200]}}"#;
        std::fs::write(&file, text).unwrap();
        let configured = |id: &TenantId| id.as_str() == "t";
        let loaded = load_histories(Some(&file), 1 << 20, configured);
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[&tenant("t")].starts(), [600, 1200, 1800]);
        let capped = load_histories(Some(&file), text.len() as u64 - 1, configured);
        assert!(capped.is_empty());
        let histories = HashMap::from([("t".to_owned(), vec![600, 1200, 1800])]);
        assert!(save_histories(&file, histories, 10).is_err());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn run_histories_outlive_the_coordinator_in_the_history_file() {
        let dir = std::env::temp_dir().join(format!("pgwake-runs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("runs.json");
        let _ = std::fs::remove_file(&file);
        {
            let (lab, t, _backend) = lab(PredictPolicy::Wake, Some(file.clone()));
            let sleeper = lab.run_idle_sleeper();
            let start = Instant::now();
            for k in 0..4 {
                run_at(&lab, &t, start + k * PERIOD).await;
            }
            sleep(2 * SECOND).await;
            drop(sleeper);
        }
        // The last write runs on a blocking thread, outside the paused clock.
        let mut saved = String::new();
        for _ in 0..200 {
            saved = std::fs::read_to_string(&file).unwrap_or_default();
            if saved.contains("\"t\":[") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(saved.contains("\"t\":["), "{saved}");
        let (lab, t, _backend) = lab(PredictPolicy::Wake, Some(file.clone()));
        let runs = lab.status(&t).runs;
        assert_eq!(runs.remembered, 4);
        assert!(matches!(
            runs.pattern,
            Some(Pattern::Periodic { period: 600, .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
