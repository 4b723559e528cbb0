//! The checkpoint: what a run leaves on disk to be resumed or evaluated,
//! how it is written so that it is either whole or absent, how the latest
//! is found, and how it is loaded back. No other module knows a file name.
//!
//! A run directory (`ragen-host train --out RUN`):
//!
//! ```text
//! RUN/
//!   config.toml        the run's config (evaluation rebuilds the model from it)
//!   metrics.jsonl      one `StepMetrics` a line
//!   checkpoint/        the latest checkpoint: what `--resume` continues
//!   checkpoint-best/   the one with the best validation success so far:
//!                      what `eval --checkpoint RUN` reads
//! ```
//!
//! A checkpoint directory (Burn's binary records; the recorder adds `.bin`):
//!
//! ```text
//! state.json            steps done, the validation success when validated,
//!                       the pretrained model it builds on (path, SHA-256)
//! model.bin             the policy's trained weights (with LoRA, only the
//!                       adapters and the value head: the base is pinned)
//! optimizer.bin         the policy's AdamW state
//! reference.bin         the frozen reference the KL term pulls towards
//!                       (only when `kl_coef` is not 0)
//! critic.bin            a critic of its own (only with `[critic]`)
//! critic-optimizer.bin  the critic's AdamW state
//! ```
//!
//! Resume reads every file, so the resumed run continues exactly;
//! evaluation reads `state.json` and `model.bin` only.
//!
//! A checkpoint `NAME/` is written whole or not at all: its files go into
//! `NAME.tmp/` beside it and are flushed to disk, `state.json` last (a
//! directory is a checkpoint only once it has one); then the previous
//! checkpoint moves to `NAME.old/`, the new one is renamed to `NAME/`, and
//! `NAME.old/` is removed. A crash or a full disk at any point leaves
//! `NAME/` whole, or, between the two renames, `NAME.old/`, which
//! [`find_checkpoint`] and resume then take instead.

use crate::config::TrainConfig;
use crate::trainee::{Chat, Scratch, Trainee};
use crate::update::Learner;
use anyhow::{Context, Result, bail, ensure};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::record::Recorder;
use burn::tensor::backend::AutodiffBackend;
use ragen_agent::Policy;
use ragen_ops::TrainBackend;
use ragen_policy::CheckpointRecorder;
use ragen_policy::PolicyNetwork;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a checkpoint remembers besides the weights.
const STATE: &str = "state.json";
/// The policy's weights (Burn's recorder adds `.bin` to each record).
const MODEL: &str = "model";
const OPTIMIZER: &str = "optimizer";
const REFERENCE: &str = "reference";
const CRITIC: &str = "critic";
const CRITIC_OPTIMIZER: &str = "critic-optimizer";

/// Files of a run directory.
pub struct RunDir(pub PathBuf);

impl RunDir {
    pub fn config(&self) -> PathBuf {
        self.0.join("config.toml")
    }
    pub fn metrics(&self) -> PathBuf {
        self.0.join("metrics.jsonl")
    }

    /// `metrics.jsonl` written anew with `lines` (a resumed run's steps so
    /// far), then opened to append to: written beside it, flushed to disk
    /// and renamed over it, so that a crash leaves the old file or the new
    /// one whole, never the reported lines cut.
    pub fn restart_metrics(&self, lines: &[String]) -> Result<std::fs::File> {
        let path = self.metrics();
        let fresh = path.with_extension("jsonl.tmp");
        let written = (|| {
            let mut file = std::fs::File::create(&fresh)?;
            for line in lines {
                writeln!(file, "{line}")?;
            }
            file.sync_all()?;
            std::fs::rename(&fresh, &path)
        })();
        written.with_context(|| format!("cannot write `{}`", path.display()))?;
        sync_parent(&path);
        std::fs::OpenOptions::new().append(true).open(&path).with_context(|| format!("cannot append to `{}`", path.display()))
    }
    /// The latest checkpoint, which `--resume` continues from.
    pub fn checkpoint(&self) -> PathBuf {
        self.0.join("checkpoint")
    }
    /// The checkpoint with the best validation success so far.
    pub fn best(&self) -> PathBuf {
        self.0.join("checkpoint-best")
    }

    /// Hold the run directory for as long as the returned file lives: a
    /// second `train` into the same directory would interleave two runs'
    /// checkpoints and `metrics.jsonl`, so it is refused while this one
    /// runs. The lock is the operating system's (`flock` on `.lock`), so it
    /// goes with the process however that ends, `SIGKILL` included, and a
    /// stale `.lock` file holds nothing.
    pub fn lock(&self) -> Result<std::fs::File> {
        let path = self.0.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open `{}` to hold the run directory", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => bail!(
                "`{}` is in use: another `train` is writing to it (it holds `{}`); wait for that run to end, or pass another --out",
                self.0.display(),
                path.display()
            ),
            Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("cannot lock `{}`", path.display())),
        }
    }
}

/// What the checkpoint remembers besides the weights (`state.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct CheckpointState {
    /// Steps completed.
    pub(crate) step: u64,
    /// Validation success of the weights, when they were validated
    /// (always, in `checkpoint-best/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) val_success: Option<f64>,
    /// The pretrained model the weights build on (its adapters, with
    /// LoRA, mean nothing on another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) base_model: Option<BaseModel>,
    /// The SHA-256 of each file the save wrote, by name (filled by the
    /// save): a damaged file is refused before any of it is decoded.
    /// Checkpoints from before it have none and are read unchecked.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub(crate) files: std::collections::BTreeMap<String, String>,
}

impl CheckpointState {
    /// Check the files `names` (their stems; all of them when `None`)
    /// against the digests the save recorded: Burn's record decoder trusts
    /// what it reads (a damaged tensor shape has it allocate exabytes, which
    /// aborts the process), so damaged bytes must not reach it.
    fn verify(dir: &Path, names: Option<&[&str]>) -> Result<()> {
        // `Learner::save` alone writes no state: nothing to check against.
        if !dir.join(STATE).exists() {
            return Ok(());
        }
        let state = Self::read(dir)?;
        for (file, digest) in &state.files {
            let stem = file.strip_suffix(".bin").unwrap_or(file);
            if names.is_some_and(|names| !names.contains(&stem)) {
                continue;
            }
            let path = dir.join(file);
            let now = ragen_llm::sha256_file(&path).with_context(|| format!("the checkpoint's `{}` is missing", path.display()))?;
            ensure!(
                &now == digest,
                "the checkpoint's `{}` is damaged: its SHA-256 is not the one `{STATE}` recorded when it was saved \
                 (resume from or evaluate another checkpoint, e.g. `checkpoint-best/`)",
                path.display()
            );
        }
        Ok(())
    }

    fn read(dir: &Path) -> Result<Self> {
        let file = dir.join(STATE);
        let text = std::fs::read_to_string(&file).with_context(|| format!("no checkpoint in `{}` (no {STATE})", dir.display()))?;
        serde_json::from_str(&text).with_context(|| format!("the checkpoint's `{}` is damaged", file.display()))
    }

    /// Write `state.json` into `dir` and flush it to disk: the last file
    /// of a checkpoint, which makes it one.
    fn write(&self, dir: &Path) -> Result<()> {
        let file = dir.join(STATE);
        let failed = || format!("cannot write `{}`", file.display());
        let mut out = std::fs::File::create(&file).with_context(failed)?;
        out.write_all(serde_json::to_string(self)?.as_bytes()).with_context(failed)?;
        out.sync_all().with_context(failed)
    }
}

/// The model file a run trains, and its SHA-256: a checkpoint of adapters
/// is only meaningful on the base it was trained from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaseModel {
    pub path: PathBuf,
    pub sha256: String,
}

impl BaseModel {
    /// The file's hash; for a Hugging Face directory, the hash of the
    /// lines `name sha256` of its weights, config and tokenizer files in
    /// name order.
    pub fn of(path: &Path) -> Result<Self> {
        let sha256 = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("cannot list `{}`", path.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "safetensors" || e == "json"))
                .collect();
            files.sort();
            use sha2::{Digest, Sha256};
            let mut lines = String::new();
            for f in &files {
                let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                lines += &format!("{name} {}\n", ragen_llm::sha256_file(f)?);
            }
            Sha256::digest(lines.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
        } else {
            ragen_llm::sha256_file(path)?
        };
        Ok(Self { path: path.to_path_buf(), sha256 })
    }

    /// Refuse `now` unless it is the file `self` recorded, the base of the
    /// run or checkpoint `subject` that is to be `verb`ed ("resume").
    pub fn ensure_same(&self, now: &BaseModel, verb: &str, subject: &Path) -> Result<()> {
        ensure!(
            self.sha256 == now.sha256,
            "cannot {verb} `{}`: it was trained on `{}` (SHA-256 {}), but `{}` is now another file (SHA-256 {}); \
             {verb} with the model it was trained on",
            subject.display(),
            self.path.display(),
            self.sha256,
            now.path.display(),
            now.sha256
        );
        Ok(())
    }
}

/// Which checkpoint [`load_trained`] read.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointInfo {
    pub dir: PathBuf,
    /// Training steps it had completed.
    pub step: u64,
    /// Its validation success, if it was validated.
    pub val_success: Option<f64>,
}

impl std::fmt::Display for CheckpointInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` (after step {}", self.dir.display(), self.step)?;
        match self.val_success {
            Some(v) => write!(f, ", validation success {:.1}%)", 100.0 * v),
            None => write!(f, ")"),
        }
    }
}

/// Write the learner's files of a checkpoint into `dir` (which exists):
/// the model, its optimizer's state, the reference and the critic with its
/// optimizer when it has them. [`Learner::save`] is this.
pub(crate) fn write_learner<B, M>(learner: &Learner<B, M>, dir: &Path) -> Result<()>
where
    B: AutodiffBackend,
    M: PolicyNetwork<B> + AutodiffModule<B, InnerModule: PolicyNetwork<B::InnerBackend>>,
{
    let recorder = CheckpointRecorder;
    let model = learner.model.as_ref().expect("the model is only taken during a step");
    model.save_weights(&dir.join(MODEL)).context("cannot write the model")?;
    recorder.record(learner.optimizer.to_record(), dir.join(OPTIMIZER)).context("cannot write the optimizer state")?;
    if let Some(reference) = &learner.reference {
        reference.save_weights(&dir.join(REFERENCE)).context("cannot write the reference model")?;
    }
    if let Some(critic) = &learner.critic {
        let model = critic.model.as_ref().expect("the critic is only taken during a step");
        model.save_weights(&dir.join(CRITIC)).context("cannot write the critic")?;
        recorder.record(critic.optimizer.to_record(), dir.join(CRITIC_OPTIMIZER)).context("cannot write the critic's optimizer state")?;
    }
    Ok(())
}

/// Restore everything [`write_learner`] wrote, to continue training
/// exactly: weights, optimizer moments, reference and critic.
/// [`Learner::load`] is this.
pub(crate) fn read_learner<B, M>(learner: &mut Learner<B, M>, dir: &Path) -> Result<()>
where
    B: AutodiffBackend,
    M: PolicyNetwork<B> + AutodiffModule<B, InnerModule: PolicyNetwork<B::InnerBackend>>,
{
    CheckpointState::verify(dir, None)?;
    read_model(learner, dir)?;
    let recorder = CheckpointRecorder;
    let record = decoded(|| Ok(recorder.load(dir.join(OPTIMIZER), &learner.device)?))
        .with_context(|| format!("cannot read the optimizer state `{}.bin`: it is damaged or incomplete", dir.join(OPTIMIZER).display()))?;
    learner.optimizer = learner.optimizer.clone().load_record(record);
    if let Some(reference) = learner.reference.take() {
        let file = dir.join(REFERENCE);
        learner.reference = Some(decoded(|| reference.load_weights(&file, &learner.device)).with_context(|| {
            format!("cannot read the checkpoint's reference model `{}.bin`: it is damaged or incomplete", file.display())
        })?);
    }
    if let Some(critic) = learner.critic.as_mut() {
        let missing = || {
            format!(
                "cannot read the checkpoint's critic from `{}`: a run configured with [critic] resumes only from a \
                 checkpoint that has one (resume with the config the run was trained with)",
                dir.display()
            )
        };
        let model = critic.model.take().expect("critic present");
        critic.model = Some(decoded(|| model.load_weights(&dir.join(CRITIC), &learner.device)).with_context(missing)?);
        let record = decoded(|| Ok(recorder.load(dir.join(CRITIC_OPTIMIZER), &learner.device)?)).with_context(missing)?;
        critic.optimizer = critic.optimizer.clone().load_record(record);
    }
    Ok(())
}

/// Restore only the trained weights [`write_learner`] wrote, to play
/// them: the optimizer's state (twice the weights under full fine-tuning)
/// and the reference stay unread. [`Learner::load_weights`] is this.
pub(crate) fn read_weights<B, M>(learner: &mut Learner<B, M>, dir: &Path) -> Result<()>
where
    B: AutodiffBackend,
    M: PolicyNetwork<B> + AutodiffModule<B>,
{
    CheckpointState::verify(dir, Some(&[MODEL]))?;
    read_model(learner, dir)
}

/// The trained weights alone, their digest already checked.
fn read_model<B, M>(learner: &mut Learner<B, M>, dir: &Path) -> Result<()>
where
    B: AutodiffBackend,
    M: PolicyNetwork<B> + AutodiffModule<B>,
{
    let model = learner.model.take().expect("model present");
    let file = dir.join(MODEL);
    learner.model = Some(
        decoded(|| model.load_weights(&file, &learner.device))
            .with_context(|| format!("cannot read the checkpoint's model `{}.bin`: it is damaged or incomplete", file.display()))?,
    );
    Ok(())
}

/// Runs `read`, a decoding of checkpoint bytes, with a panic inside it
/// turned into an error: Burn's record decoder panics on some damage (a
/// parameter id that is not one) instead of returning an error.
fn decoded<T>(read: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read))
        .unwrap_or_else(|_| Err(anyhow::anyhow!("Burn's record decoder could not read it (it panicked)")))
}

/// Write the checkpoint `target` of `learner` with `state`, whole or not
/// at all (the module doc's steps).
pub(crate) fn save<B, M>(learner: &Learner<B, M>, target: &Path, state: &CheckpointState) -> Result<()>
where
    B: AutodiffBackend,
    M: PolicyNetwork<B> + AutodiffModule<B, InnerModule: PolicyNetwork<B::InnerBackend>>,
{
    replace(target, state, |dir| write_learner(learner, dir))
}

/// Put a new checkpoint in place of `target`: `fill` writes its files into
/// `target.tmp/`, then `state.json`, then the swap through `target.old/`.
fn replace(target: &Path, state: &CheckpointState, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let (tmp, old) = (target.with_extension("tmp"), target.with_extension("old"));
    remove_if_present(&tmp)?;
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create `{}`", tmp.display()))?;
    fill(&tmp)?;
    let mut state = state.clone();
    state.files = sync_files(&tmp)?;
    state.write(&tmp)?;
    if is_whole(target) {
        remove_if_present(&old)?;
        std::fs::rename(target, &old).context("cannot move the previous checkpoint aside")?;
    } else {
        // A directory without state.json is no checkpoint; `old`, if whole,
        // is the last good one and stays until the new one is in place.
        remove_if_present(target)?;
    }
    std::fs::rename(&tmp, target).context("cannot put the new checkpoint in place")?;
    sync_parent(target);
    // Harmless if it stays (a whole `target` comes first): the next save
    // removes it.
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// Whether `dir` is a checkpoint: `state.json` is its last file written.
fn is_whole(dir: &Path) -> bool {
    dir.join(STATE).is_file()
}

/// The checkpoint `target` stands for: itself when whole, else the previous
/// one a save had moved aside when it stopped between its two renames,
/// else `target` (whose reading then says that it has no checkpoint).
fn latest(target: &Path) -> PathBuf {
    let old = target.with_extension("old");
    if !is_whole(target) && is_whole(&old) { old } else { target.to_path_buf() }
}

/// Remove the checkpoint `target` and the previous one beside it.
fn discard(target: &Path) -> Result<()> {
    remove_if_present(target)?;
    remove_if_present(&target.with_extension("old"))
}

fn remove_if_present(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove `{}` (remove it by hand, or check its permissions)", dir.display()))
        }
        _ => Ok(()),
    }
}

/// Flush every file of `dir` to disk, so that a power cut after
/// `state.json` is written cannot leave a checkpoint whose weights are
/// still in the page cache only; returns each file's SHA-256, by name,
/// for `state.json` to record.
fn sync_files(dir: &Path) -> Result<std::collections::BTreeMap<String, String>> {
    let mut digests = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list `{}`", dir.display()))? {
        let path = entry.with_context(|| format!("cannot list `{}`", dir.display()))?.path();
        if path.is_file() {
            std::fs::File::open(&path).and_then(|f| f.sync_all()).with_context(|| format!("cannot flush `{}` to disk", path.display()))?;
            digests.insert(path.file_name().unwrap_or_default().to_string_lossy().into_owned(), ragen_llm::sha256_file(&path)?);
        }
    }
    Ok(digests)
}

/// Flush the renames in `target`'s parent directory to disk. Best effort:
/// not every platform opens a directory as a file, and every process sees
/// the renames already.
fn sync_parent(target: &Path) {
    if let Some(parent) = target.parent() {
        let _ = std::fs::File::open(parent).and_then(|d| d.sync_all());
    }
}

/// Where a resumed run starts: the first step still to run, and the best
/// validation success so far.
pub(crate) struct Resumed {
    pub(crate) step: u64,
    pub(crate) best: Option<f64>,
}

/// Load the latest checkpoint of `run` into `learner` to continue it
/// exactly, refusing it when it was trained on another base model than
/// `base`. The best checkpoint is kept unless it came from steps about to
/// be replayed (a crash after it and before the next regular checkpoint):
/// then it is removed, and the replay validates those steps again.
pub(crate) fn resume<B, M>(run: &RunDir, learner: &mut Learner<B, M>, base: Option<&BaseModel>) -> Result<Resumed>
where
    B: AutodiffBackend,
    M: PolicyNetwork<B> + AutodiffModule<B, InnerModule: PolicyNetwork<B::InnerBackend>>,
{
    let dir = latest(&run.checkpoint());
    let state = CheckpointState::read(&dir).with_context(|| format!("cannot resume `{}`", run.0.display()))?;
    if let (Some(then), Some(now)) = (&state.base_model, base) {
        then.ensure_same(now, "resume", &run.0)?;
    }
    read_learner(learner, &dir)?;
    let mut best = None;
    if let Ok(saved) = CheckpointState::read(&latest(&run.best())) {
        if saved.step <= state.step {
            best = saved.val_success;
        } else {
            discard(&run.best()).context("cannot remove a best checkpoint newer than the one resumed")?;
        }
    }
    Ok(Resumed { step: state.step, best })
}

/// The run directory and the checkpoint that `path` names: a run directory
/// (its `checkpoint-best/` when validation kept one, else its latest
/// `checkpoint/`) or one checkpoint directory inside a run.
pub fn find_checkpoint(path: &Path) -> Result<(RunDir, PathBuf)> {
    // A checkpoint named that a save left between its renames is found
    // beside it; a directory that exists is taken as it is.
    let named = if path.is_dir() { path.to_path_buf() } else { latest(path) };
    if is_whole(&named) {
        let run = path.parent().filter(|p| p.join("config.toml").exists()).with_context(|| {
            format!("`{}` is a checkpoint, but the folder above it has no config.toml: pass the run directory", path.display())
        })?;
        return Ok((RunDir(run.to_path_buf()), named));
    }
    let run = RunDir(path.to_path_buf());
    let best = latest(&run.best());
    let checkpoint = if is_whole(&best) { best } else { latest(&run.checkpoint()) };
    Ok((run, checkpoint))
}

/// A trained policy for evaluation from `path` (see [`find_checkpoint`]),
/// sampling from `seed` at `temperature` (`None`: the run's validation
/// temperature), the run's config, and which checkpoint it read. A
/// pretrained model's checkpoint is refused on another model file than the
/// one it was trained on.
pub fn load_trained<B: TrainBackend>(
    path: &Path,
    spec: &ragen_runtime::EnvSpec,
    device: B::Device,
    seed: u64,
    temperature: Option<f32>,
) -> Result<(Box<dyn Policy>, TrainConfig, CheckpointInfo)> {
    let (run, checkpoint) = find_checkpoint(path)?;
    let config = TrainConfig::load(&run.config())?;
    let state = CheckpointState::read(&checkpoint)?;
    let temperature = temperature.unwrap_or(config.sampling.val_temperature as f32);
    let policy = match &config.model_path {
        None => loaded(Scratch::build::<B>(&config, spec, device.clone())?, &checkpoint, temperature, seed, &device)?,
        Some(model) => {
            if let Some(then) = &state.base_model {
                then.ensure_same(&BaseModel::of(model)?, "evaluate", &checkpoint)?;
            }
            loaded(Chat::build::<B>(&config, model, device.clone())?, &checkpoint, temperature, seed, &device)?
        }
    };
    let info = CheckpointInfo { dir: checkpoint, step: state.step, val_success: state.val_success };
    Ok((policy, config, info))
}

/// The policy of a freshly built trainee and learner once `checkpoint` is
/// loaded into it.
fn loaded<B: TrainBackend, T: Trainee<B>>(
    (trainee, mut learner): (T, Learner<B, T::Net>),
    checkpoint: &Path,
    temperature: f32,
    seed: u64,
    device: &B::Device,
) -> Result<Box<dyn Policy>> {
    read_weights(&mut learner, checkpoint)?;
    Ok(trainee.policy(learner.policy_model(), temperature, seed, device))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary one.
    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ragen-checkpoint-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn state(step: u64) -> CheckpointState {
        CheckpointState { step, val_success: None, base_model: None, files: Default::default() }
    }

    /// A checkpoint whose one weights file says which step wrote it.
    fn save_step(target: &Path, step: u64) -> Result<()> {
        replace(target, &state(step), |dir| Ok(std::fs::write(dir.join("model.bin"), step.to_string())?))
    }

    fn step_of(dir: &Path) -> u64 {
        CheckpointState::read(dir).unwrap().step
    }

    #[test]
    fn metrics_restart_whole_and_take_appended_lines_after() {
        let run = RunDir(scratch_dir("metrics"));
        std::fs::write(run.metrics(), "old 1\nold 2\nold 3\n").unwrap();
        let mut file = run.restart_metrics(&["a".into(), "b".into()]).unwrap();
        writeln!(file, "c").unwrap();
        assert_eq!(std::fs::read_to_string(run.metrics()).unwrap(), "a\nb\nc\n");
        assert!(!run.metrics().with_extension("jsonl.tmp").exists(), "nothing is left beside it");
    }

    #[test]
    fn a_save_replaces_the_checkpoint_and_leaves_nothing_beside_it() {
        let run = scratch_dir("replace");
        let target = run.join("checkpoint");
        save_step(&target, 1).unwrap();
        save_step(&target, 2).unwrap();
        assert_eq!(step_of(&target), 2);
        assert_eq!(std::fs::read_to_string(target.join("model.bin")).unwrap(), "2");
        assert!(!target.with_extension("tmp").exists() && !target.with_extension("old").exists());
        std::fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn a_save_that_fails_leaves_the_previous_checkpoint_whole() {
        let run = scratch_dir("failed");
        let target = run.join("checkpoint");
        save_step(&target, 1).unwrap();
        let err = replace(&target, &state(2), |_| Err(anyhow::anyhow!("disk full"))).unwrap_err();
        assert!(format!("{err:#}").contains("disk full"));
        assert_eq!(step_of(&latest(&target)), 1);
        // The half-written one has no state.json: never taken for a checkpoint.
        assert!(!is_whole(&target.with_extension("tmp")));
        save_step(&target, 2).unwrap();
        assert_eq!(step_of(&target), 2);
        std::fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn a_crash_between_the_renames_leaves_the_previous_checkpoint_found() {
        let run = scratch_dir("crash");
        std::fs::write(run.join("config.toml"), "").unwrap();
        let target = run.join("checkpoint");
        save_step(&target, 1).unwrap();
        // The state a crash after the first rename leaves.
        std::fs::rename(&target, target.with_extension("old")).unwrap();
        assert_eq!(latest(&target), target.with_extension("old"));
        let (_, found) = find_checkpoint(&run).unwrap();
        assert_eq!(step_of(&found), 1, "the run's latest is the one moved aside");
        let (_, found) = find_checkpoint(&target).unwrap();
        assert_eq!(step_of(&found), 1, "so is the checkpoint named");
        // The next save keeps it until the new one is in place, then removes it.
        save_step(&target, 2).unwrap();
        assert_eq!(step_of(&latest(&target)), 2);
        assert!(!target.with_extension("old").exists());
        std::fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn a_run_directory_is_held_by_one_run_at_a_time() {
        let dir = scratch_dir("lock");
        let run = RunDir(dir.clone());
        let held = run.lock().unwrap();
        let err = format!("{:#}", run.lock().unwrap_err());
        assert!(err.contains("is in use: another `train` is writing to it") && err.contains("another --out"), "{err}");
        // Released with the file (as when the process ends): the next run may start.
        drop(held);
        drop(run.lock().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_run_directory_names_its_best_checkpoint_else_its_latest() {
        let dir = scratch_dir("find");
        std::fs::write(dir.join("config.toml"), "").unwrap();
        let run = RunDir(dir.clone());
        save_step(&run.checkpoint(), 4).unwrap();
        assert_eq!(find_checkpoint(&dir).unwrap().1, run.checkpoint());
        save_step(&run.best(), 2).unwrap();
        assert_eq!(find_checkpoint(&dir).unwrap().1, run.best());
        let (named, checkpoint) = find_checkpoint(&run.checkpoint()).unwrap();
        assert_eq!((named.0, checkpoint), (dir.clone(), run.checkpoint()), "a checkpoint named: its run is the folder above");
        // A checkpoint outside a run directory is refused, with what to pass.
        std::fs::remove_file(dir.join("config.toml")).unwrap();
        let err = format!("{:#}", find_checkpoint(&run.checkpoint()).err().unwrap());
        assert!(err.contains("pass the run directory"), "{err}");
        // Discarding the best removes it and the one beside it.
        discard(&run.best()).unwrap();
        assert!(!run.best().exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Fuzzing the checkpoint: its files are bytes a crash, a full disk or
/// someone else may have left, so any damage to them loads or is refused
/// with an error, never a panic and never an allocation sized by a number
/// read from the file (`make fuzz` runs it longer). Each case starts from
/// a real checkpoint of a tiny model (weights, AdamW state, the reference
/// model, `state.json`) and damages one file: bytes overwritten, a large
/// little-endian integer planted where lengths live, or the file cut.
#[cfg(test)]
mod fuzz {
    use super::*;
    use crate::update::UpdateConfig;
    use burn::backend::{Autodiff, Flex};
    use proptest::prelude::*;
    use ragen_policy::{PolicyModel, PolicyModelConfig};
    use std::sync::OnceLock;

    type B = Autodiff<Flex>;

    /// A learner on a tiny model, with a reference model (`kl_coef` > 0).
    fn learner() -> Learner<B, PolicyModel<B>> {
        let model =
            PolicyModelConfig::new(12).with_d_model(8).with_n_layers(1).with_n_heads(2).with_max_seq_len(16).init(&Default::default());
        Learner::new(model, None, UpdateConfig { kl_coef: 0.01, ..UpdateConfig::default() }, Default::default())
    }

    /// The files of one checkpoint of [`learner`], by name.
    fn files() -> &'static Vec<(String, Vec<u8>)> {
        static FILES: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
        FILES.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("ragen-fuzz-checkpoint-{}", std::process::id()));
            let target = dir.join("checkpoint");
            replace(&target, &CheckpointState { step: 3, val_success: Some(0.5), base_model: None, files: Default::default() }, |d| {
                write_learner(&learner(), d)
            })
            .unwrap();
            let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&target)
                .unwrap()
                .map(|e| e.unwrap())
                .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
                .collect();
            files.sort();
            std::fs::remove_dir_all(&dir).unwrap();
            assert!(files.len() >= 4, "weights, optimizer, reference and state: {:?}", files.iter().map(|f| &f.0).collect::<Vec<_>>());
            files
        })
    }

    #[derive(Debug, Clone)]
    enum Damage {
        /// Bytes written over the file at a position (a share of its length).
        Overwrite(f64, Vec<u8>),
        /// A little-endian integer planted there: lengths and counts live
        /// in the file as such.
        Plant(f64, u64),
        /// The file cut to a share of its length.
        Cut(f64),
    }

    fn damage() -> impl Strategy<Value = Damage> {
        let big = prop_oneof![Just(u64::MAX), Just(u64::MAX / 2), Just(1 << 40), Just(1 << 32), Just(u32::MAX as u64), any::<u64>()];
        prop_oneof![
            (0.0..1.0f64, prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(at, b)| Damage::Overwrite(at, b)),
            (0.0..1.0f64, big).prop_map(|(at, n)| Damage::Plant(at, n)),
            (0.0..1.0f64).prop_map(Damage::Cut),
        ]
    }

    fn damaged(mut bytes: Vec<u8>, damages: &[Damage]) -> Vec<u8> {
        let at = |share: f64, len: usize| ((share * len as f64) as usize).min(len.saturating_sub(1));
        for d in damages {
            match d {
                Damage::Overwrite(..) | Damage::Plant(..) if bytes.is_empty() => {}
                Damage::Overwrite(share, new) => {
                    let start = at(*share, bytes.len());
                    let end = (start + new.len()).min(bytes.len());
                    bytes[start..end].copy_from_slice(&new[..end - start]);
                }
                Damage::Plant(share, n) => {
                    let start = at(*share, bytes.len());
                    let n = n.to_le_bytes();
                    let end = (start + 8).min(bytes.len());
                    bytes[start..end].copy_from_slice(&n[..end - start]);
                }
                Damage::Cut(share) => bytes.truncate((share * bytes.len() as f64) as usize),
            }
        }
        bytes
    }

    /// With the digests the save records, one flipped byte in any file is
    /// refused before it is decoded, naming the file.
    #[test]
    fn a_damaged_file_is_refused_by_its_digest_naming_it() {
        let dir = std::env::temp_dir().join(format!("ragen-fuzz-digest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = &files().iter().find(|f| f.0 == STATE).unwrap().1;
        assert!(String::from_utf8_lossy(state).contains("\"files\""), "the save records digests");
        for (victim, _) in files().iter().filter(|f| f.0 != STATE) {
            for (name, bytes) in files() {
                let mut bytes = bytes.clone();
                if name == victim {
                    let middle = bytes.len() / 2;
                    bytes[middle] ^= 1;
                }
                std::fs::write(dir.join(name), bytes).unwrap();
            }
            let error = format!("{:#}", learner().load(&dir).unwrap_err());
            assert!(error.contains(victim.as_str()) && error.contains("SHA-256"), "{victim}: {error}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
            failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::WithSource("regressions"))),
            ..ProptestConfig::default()
        })]

        #[test]
        fn a_damaged_checkpoint_loads_or_is_refused_never_panics(which in any::<prop::sample::Index>(), damages in prop::collection::vec(damage(), 1..4)) {
            let dir = std::env::temp_dir().join(format!("ragen-fuzz-damaged-{}-{:?}", std::process::id(), std::thread::current().id()));
            std::fs::create_dir_all(&dir).unwrap();
            let files = files();
            let victim = which.index(files.len());
            for (i, (name, bytes)) in files.iter().enumerate() {
                let bytes = if i == victim { damaged(bytes.clone(), &damages) } else { bytes.clone() };
                std::fs::write(dir.join(name), bytes).unwrap();
            }
            let _ = CheckpointState::read(&dir);
            let _ = learner().load(&dir);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
