//! The fidelity benchmark's app zoo: real ORMs with their default settings (SQLAlchemy and
//! Django on psycopg 3, Drizzle on node-postgres, GORM on pgx, Hibernate on pgjdbc), each holding
//! a pool of at least five connections over a schema keyed by serial or identity columns.
//!
//! Each application (in `clients/zoo/`) sets up its schema the framework's way, opens its pool,
//! prints `ready N` (N: connections held) and then runs the steps of one create / read / update /
//! delete flow, each inside a transaction, when the harness writes `step`; a step prints its ids,
//! rows and counts as `out ...` lines and ends with `ok`. `quit` closes the pool (`done`).
//!
//! The flow runs twice: once straight against a throwaway Postgres, steps back to back, and once
//! through pgwake during the fidelity benchmark's hour, where the tenant sleeps between steps, so
//! every pooled session is parked and revived on another backend connection between them. The
//! two transcripts must be equal.

use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use pgwake_testkit::{PgOptions, TestPostgres};

/// Steps of the flow: create, read, update, create, delete, read.
pub const STEPS: u32 = 6;
/// How long an application may take to set up its schema and open its pool (migrations and a
/// JVM start included, through a wake).
const READY_WITHIN: Duration = Duration::from_secs(180);
/// How long one step may take, a wake included.
pub const STEP_WITHIN: Duration = Duration::from_secs(60);

/// One framework of the zoo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framework {
    /// SQLAlchemy 2 ORM on psycopg 3, its default `QueuePool` (5).
    Sqlalchemy,
    /// Django ORM on psycopg 3 with Django's psycopg pool (5), `migrate` through the URL.
    Django,
    /// Drizzle ORM on node-postgres, `pg.Pool` (its default 10), Drizzle's migrator.
    Drizzle,
    /// GORM on pgx's `database/sql` driver (10), `AutoMigrate`.
    Gorm,
    /// Hibernate ORM on pgjdbc with HikariCP (its default 10), `hbm2ddl`.
    Hibernate,
}

impl Framework {
    /// The report's name of the application.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Sqlalchemy => "zoo: SQLAlchemy ORM on psycopg 3",
            Framework::Django => "zoo: Django ORM on psycopg 3",
            Framework::Drizzle => "zoo: Drizzle ORM on node-postgres",
            Framework::Gorm => "zoo: GORM on pgx",
            Framework::Hibernate => "zoo: Hibernate on pgjdbc (HikariCP)",
        }
    }

    /// Installs what the application needs (cached between runs), builds it into `work` where
    /// it is compiled, and says how to start it.
    pub fn prepare(self, work: &Path) -> Result<Launcher> {
        let zoo = clients().join("zoo");
        Ok(match self {
            Framework::Sqlalchemy | Framework::Django => Launcher {
                program: python()?,
                args: vec![
                    zoo.join(match self {
                        Framework::Sqlalchemy => "sqlalchemy_orm.py",
                        _ => "django_app.py",
                    })
                    .into(),
                ],
            },
            Framework::Drizzle => {
                let dir = zoo.join("drizzle");
                npm_ci(&dir, "drizzle-orm")?;
                Launcher {
                    program: "node".into(),
                    args: vec![dir.join("app.mjs").into()],
                }
            }
            Framework::Gorm => {
                let binary = work.join("zoo-gorm");
                go_build(&zoo.join("gorm"), &binary)?;
                Launcher {
                    program: binary,
                    args: Vec::new(),
                }
            }
            Framework::Hibernate => {
                let classes = work.join("hibernate-classes");
                let classpath = hibernate(&zoo.join("hibernate"), &classes)?;
                Launcher {
                    program: "java".into(),
                    args: vec!["-cp".into(), classpath.into(), "Zoo".into()],
                }
            }
        })
    }
}

/// The folder of the benchmark's client applications.
pub fn clients() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients")
}

/// The zoo's cache of installed packages, kept between runs.
fn cache() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/pgwake/zoo")
}

/// Whether `program` ran and succeeded.
fn ran(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The Python of a virtual environment holding `clients/requirements.txt`, made (or remade when
/// that file changed) on first use. The copy of the file in the environment marks a complete
/// install.
pub fn python() -> Result<PathBuf> {
    let wanted = fs::read(clients().join("requirements.txt"))?;
    let venv = cache().join("venv");
    let marker = venv.join("requirements.txt");
    if fs::read(&marker).ok().as_ref() != Some(&wanted) {
        crate::progress(format_args!(
            "fidelity: installing the Python clients into {} ...",
            venv.display()
        ));
        let _ = fs::remove_dir_all(&venv);
        if !ran(Command::new("python3").arg("-m").arg("venv").arg(&venv)) {
            bail!("python3 -m venv failed (install python3 and python3-venv)");
        }
        let pip = ran(Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "-r"])
            .arg(clients().join("requirements.txt")));
        if !pip {
            bail!("pip install -r clients/requirements.txt failed");
        }
        fs::write(&marker, wanted)?;
    }
    Ok(venv.join("bin/python"))
}

/// `npm ci` in `dir` unless `package` is installed there already.
pub fn npm_ci(dir: &Path, package: &str) -> Result<()> {
    if dir.join("node_modules").join(package).exists() {
        return Ok(());
    }
    let ok = ran(Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(dir));
    if !ok {
        bail!(
            "npm ci in {} failed (install nodejs and npm)",
            dir.display()
        );
    }
    Ok(())
}

/// The Go toolchain, on PATH or where the official tarball puts it.
fn which_go() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("go"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|p| p.is_file()))
}

/// Builds the Go module in `dir` into `binary` (modules come through the Go module proxy).
pub fn go_build(dir: &Path, binary: &Path) -> Result<()> {
    let go = which_go().ok_or_else(|| anyhow!("no Go toolchain (install Go)"))?;
    let ok = Command::new(go)
        .args(["build", "-o"])
        .arg(binary)
        .arg(".")
        .current_dir(dir)
        .env("GOTOOLCHAIN", "local")
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!("go build in {} failed", dir.display());
    }
    Ok(())
}

/// Fetches the jars `dir/pom.xml` names (once per version of it) and compiles `dir/Zoo.java`
/// into `classes`; returns the class path.
fn hibernate(dir: &Path, classes: &Path) -> Result<String> {
    if !ran(Command::new("java").arg("-version").stderr(Stdio::null()))
        || !ran(Command::new("mvn").arg("-v"))
    {
        bail!("java and mvn are needed (apt-get install default-jdk-headless maven)");
    }
    let lib = cache().join("hibernate-lib");
    let pom = fs::read(dir.join("pom.xml"))?;
    if fs::read(lib.join("pom.xml")).ok().as_ref() != Some(&pom) {
        let _ = fs::remove_dir_all(&lib);
        let ok = ran(Command::new("mvn")
            .args([
                "-q",
                "-B",
                "-Dstyle.color=never",
                "dependency:copy-dependencies",
            ])
            .arg(format!("-DoutputDirectory={}", lib.display()))
            .current_dir(dir));
        if !ok {
            bail!("mvn could not fetch the Hibernate application's jars");
        }
        // Written last: it marks a complete download.
        fs::write(lib.join("pom.xml"), pom)?;
    }
    let jars = format!("{}/*", lib.display());
    let ok = ran(Command::new("javac")
        .arg("-d")
        .arg(classes)
        .args(["-cp", &jars])
        .arg(dir.join("Zoo.java")));
    if !ok {
        bail!("javac of the Hibernate application failed");
    }
    Ok(format!("{}:{jars}", classes.display()))
}

/// How to start one application.
pub struct Launcher {
    program: PathBuf,
    args: Vec<OsString>,
}

impl Launcher {
    /// The command, its last argument the `postgres://` URL to connect to.
    pub fn command(&self, url: &str) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).arg(url);
        cmd
    }
}

/// A client application's process and the lines of its stdout; killed if dropped early.
pub struct Lines {
    child: Child,
    lines: Receiver<String>,
}

impl Lines {
    /// Starts `cmd` with stdout read line by line on a thread of its own.
    pub fn spawn(cmd: &mut Command) -> Result<Lines> {
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the application")?;
        let out = child.stdout.take().context("application stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Lines { child, lines })
    }

    /// The next line, waiting at most `limit`.
    pub fn next(&self, limit: Duration) -> Result<String> {
        match self.lines.recv_timeout(limit) {
            Ok(l) => Ok(l),
            Err(RecvTimeoutError::Timeout) => bail!("no answer from the application in {limit:?}"),
            Err(RecvTimeoutError::Disconnected) => bail!("the application ended early"),
        }
    }

    /// A line if one is there.
    pub fn try_next(&self) -> Result<Option<String>> {
        match self.lines.try_recv() {
            Ok(l) => Ok(Some(l)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => bail!("the application ended early"),
        }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running zoo application, driven step by step.
pub struct App {
    lines: Lines,
    stdin: ChildStdin,
    log: PathBuf,
    /// Connections its pool holds open.
    pub pool: u32,
    /// Each finished step's `out` lines.
    transcript: Vec<Vec<String>>,
    /// The step running now, its lines so far.
    running: Option<Vec<String>>,
}

impl App {
    /// Starts the application on `url` with its stderr in `log`, and waits until its schema is
    /// in place and its pool open.
    pub fn start(launcher: &Launcher, url: &str, log: &Path) -> Result<App> {
        let mut cmd = launcher.command(url);
        cmd.stdin(Stdio::piped())
            .stderr(fs::File::create(log).context("the application's log")?);
        let mut lines = Lines::spawn(&mut cmd)?;
        let stdin = lines.child.stdin.take().context("application stdin")?;
        let mut app = App {
            lines,
            stdin,
            log: log.to_owned(),
            pool: 0,
            transcript: Vec::new(),
            running: None,
        };
        let ready = app.lines.next(READY_WITHIN).map_err(|e| app.failed(e))?;
        app.pool = ready
            .strip_prefix("ready ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| app.failed(anyhow!("the application printed {ready:?}, not ready N")))?;
        Ok(app)
    }

    /// `e` with the last lines of the application's stderr.
    fn failed(&self, e: anyhow::Error) -> anyhow::Error {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        anyhow!("{e:#}; its stderr ends: {}", tail.join(" / "))
    }

    /// Steps finished.
    pub fn steps_done(&self) -> u32 {
        self.transcript.len() as u32
    }

    /// Whether a step is running.
    pub fn busy(&self) -> bool {
        self.running.is_some()
    }

    /// Starts the next step.
    pub fn begin_step(&mut self) -> Result<()> {
        if self.busy() {
            bail!("a step is still running");
        }
        writeln!(self.stdin, "step").and_then(|()| self.stdin.flush())?;
        self.running = Some(Vec::new());
        Ok(())
    }

    /// Reads what the application printed so far; true once no step is running.
    pub fn poll(&mut self) -> Result<bool> {
        while self.busy() {
            let Some(line) = self.lines.try_next().map_err(|e| self.failed(e))? else {
                return Ok(false);
            };
            self.take(line)?;
        }
        Ok(true)
    }

    /// Waits for the running step to finish.
    pub fn wait_step(&mut self) -> Result<()> {
        let deadline = Instant::now() + STEP_WITHIN;
        while self.busy() {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.next(left).map_err(|e| self.failed(e))?;
            self.take(line)?;
        }
        Ok(())
    }

    fn take(&mut self, line: String) -> Result<()> {
        let Some(out) = self.running.as_mut() else {
            bail!("the application printed {line:?} between steps");
        };
        if line == "ok" {
            let out = self.running.take().unwrap_or_default();
            self.transcript.push(out);
        } else if let Some(rest) = line.strip_prefix("out ") {
            out.push(rest.to_owned());
        } else {
            return Err(self.failed(anyhow!("the application printed {line:?} in a step")));
        }
        Ok(())
    }

    /// Closes the pool and returns the transcript, one entry per step.
    pub fn finish(mut self) -> Result<Vec<Vec<String>>> {
        self.wait_step()?;
        writeln!(self.stdin, "quit").and_then(|()| self.stdin.flush())?;
        match self.lines.next(STEP_WITHIN) {
            Ok(l) if l == "done" => Ok(std::mem::take(&mut self.transcript)),
            Ok(l) => Err(self.failed(anyhow!("the application printed {l:?}, not done"))),
            Err(e) => Err(self.failed(e)),
        }
    }
}

/// Runs the whole flow straight against a throwaway Postgres, steps back to back; `work` holds
/// the application's log.
pub fn direct(launcher: &Launcher, work: &Path) -> Result<Vec<Vec<String>>> {
    let pg = TestPostgres::start(PgOptions::default()).context("start PostgreSQL")?;
    let url = format!(
        "postgres://{}:{}@127.0.0.1:{}/postgres?sslmode=disable",
        pg.options.user, pg.options.password, pg.port
    );
    let mut app = App::start(launcher, &url, &work.join("direct.log"))?;
    for _ in 0..STEPS {
        app.begin_step()?;
        app.wait_step()?;
    }
    app.finish()
}

/// Where the transcript through pgwake differs from the one straight against Postgres, one line
/// per step that differs.
pub fn differences(direct: &[Vec<String>], through: &[Vec<String>]) -> Vec<String> {
    let mut out = Vec::new();
    for step in 0..direct.len().max(through.len()) {
        let (d, t) = (direct.get(step), through.get(step));
        if d != t {
            let show = |s: Option<&Vec<String>>| {
                s.map_or_else(|| "(not run)".to_owned(), |lines| lines.join("; "))
            };
            out.push(format!(
                "step {}: direct `{}`, through pgwake `{}`",
                step + 1,
                show(d),
                show(t)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transcripts_differ_by_step() {
        let a = vec![vec!["author 1 Ada".to_owned()], vec!["row 1".to_owned()]];
        assert!(differences(&a, &a).is_empty());
        let b = vec![vec!["author 2 Ada".to_owned()]];
        assert_eq!(
            differences(&a, &b),
            [
                "step 1: direct `author 1 Ada`, through pgwake `author 2 Ada`",
                "step 2: direct `row 1`, through pgwake `(not run)`",
            ]
        );
    }
}
