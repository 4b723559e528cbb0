//! Several training passes at once, on a CPU backend.
//!
//! The learner splits a mini-batch into passes, each with its own backward
//! pass, and adds up their gradients. On flex, one pass at a time leaves a
//! core idle for much of it: its matrix products and attention use every
//! core, but the element-wise operations, allocations and autodiff
//! bookkeeping between them run on one thread. Two passes at once fill
//! each other's gaps, best with each pass on a one-thread pool of its own,
//! running its kernels itself (docs/results.md, "Attention in blocks, and
//! a pass per core" and "A pool per pass, memory kept, and token scores in
//! one kernel").
//!
//! Each pass in flight beyond the first works on a copy of the model with
//! fresh autodiff leaves ([`AutodiffModule::from_inner`], sharing the
//! weights' memory). Passes whose parameters were the same leaves would be
//! one autodiff graph, and Burn holds a graph's lock for its whole backward
//! pass: they would run one at a time. The copies keep the parameters' ids,
//! so each pass's gradients map onto the model's own
//! ([`GradientsParams::from_grads`]).

use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::AutodiffBackend;

use crate::ScoringBackend;

/// Runs `pass` on each item of `work` with `model`, up to
/// [`ScoringBackend::passes_at_once`] at a time, and returns the results
/// in `work`'s order. At most that many passes are in memory at once.
///
/// Each pass in a wave of several runs on a rayon pool of one thread of
/// its own, so its kernels run inline on that thread: nothing is handed
/// from one thread to another, and two passes fill two cores. A wave of
/// one pass (the last of an uneven split) runs on the caller's thread and
/// its kernels use every core.
///
/// Why never on the global pool's workers: after each backward pass Burn
/// 0.21 locks every autodiff graph in turn to free what is no longer
/// needed (`GraphCleaner::cleanup_orphaned_entries`), and it holds a
/// graph's lock through that graph's backward pass, kernels included. A
/// worker waiting there for a graph whose backward pass waits on that
/// worker's kernels would never wake: the first version, passes on the
/// global workers, deadlocked that way when two tests trained at once. A
/// pass's own pool runs only that pass's kernels, so a wait there always
/// ends.
pub fn concurrent_passes<B, M, T, R>(model: &M, work: Vec<T>, pass: impl Fn(&M, T) -> R + Sync) -> Vec<R>
where
    B: AutodiffBackend + ScoringBackend,
    M: AutodiffModule<B>,
    T: Send,
    R: Send,
{
    let at_once = B::passes_at_once().clamp(1, work.len().max(1));
    let pools = (at_once > 1).then(|| one_thread_pools(at_once)).flatten();
    let Some(pools) = pools else {
        return work.into_iter().map(|item| pass(model, item)).collect();
    };
    let copy = || M::from_inner(model.valid());
    let mut models: Vec<M> = std::iter::once(model.clone()).chain((1..at_once).map(|_| copy())).collect();
    let mut out = Vec::with_capacity(work.len());
    let mut work = work.into_iter().peekable();
    let pass = &pass;
    while work.peek().is_some() {
        // `take` first: `zip` may pull an item from `work` before it finds
        // the models exhausted, and drop it.
        let wave: Vec<(T, M)> = work.by_ref().take(models.len()).zip(models.drain(..)).collect();
        let done: Vec<(R, M)> = if wave.len() == 1 {
            wave.into_iter().map(|(item, m)| (pass(&m, item), m)).collect()
        } else {
            std::thread::scope(|scope| {
                let running: Vec<_> = wave
                    .into_iter()
                    .zip(&pools)
                    .map(|((item, m), pool)| scope.spawn(move || pool.install(move || (pass(&m, item), m))))
                    .collect();
                running.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
            })
        };
        for (result, m) in done {
            out.push(result);
            models.push(m);
        }
    }
    out
}

/// `n` rayon pools of one thread each, or `None` (with a warning) if the
/// system will not start the threads, in which case the passes run one
/// at a time.
fn one_thread_pools(n: usize) -> Option<Vec<rayon::ThreadPool>> {
    let build = |i| rayon::ThreadPoolBuilder::new().num_threads(1).thread_name(move |_| format!("ragen-pass-{i}")).build();
    match (0..n).map(build).collect() {
        Ok(pools) => Some(pools),
        Err(e) => {
            tracing::warn!("could not start a thread per training pass ({e}); running the passes one at a time");
            None
        }
    }
}

/// The sum of `grads`, each from a pass over part of a batch, as
/// gradients of `model`.
pub fn sum_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M, grads: Vec<GradientsParams>) -> GradientsParams {
    let mut sum = GradientsAccumulator::<M>::new();
    for g in grads {
        sum.accumulate(model, g);
    }
    sum.grads()
}
