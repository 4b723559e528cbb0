//! Several training passes at once, on a CPU backend.
//!
//! The learner splits a mini-batch into passes, each with its own backward
//! pass, and adds up their gradients. On flex, one pass at a time leaves a
//! core idle for much of it: its matrix products and attention use every
//! core, but the element-wise operations, allocations and autodiff
//! bookkeeping between them run on one thread. Measured on 2 cores, the
//! default model's pass kept 1.2 cores busy. Two passes at once fill each
//! other's gaps: the bench's training pass went from about 37,000 to
//! 54,000-56,000 tokens/s with each pass on a plain thread handing its
//! kernels to rayon's workers, and to 56,000-65,000 (against 48,500-52,400
//! in the same sitting) with each pass on a one-thread pool of its own,
//! running its kernels itself.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PolicyModelConfig;
    use crate::bench::next_token_loss;
    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use burn::prelude::*;

    type Ad = Autodiff<Flex>;

    /// Every parameter's gradient, in the model's order.
    fn flat(model: &crate::PolicyModel<Ad>, grads: &GradientsParams) -> Vec<f32> {
        struct Collect<'a>(&'a GradientsParams, Vec<f32>);
        impl burn::module::ModuleVisitor<Ad> for Collect<'_> {
            fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<Ad, D>>) {
                let g = self.0.get::<Flex, D>(param.id).expect("every parameter has a gradient");
                self.1.extend(g.into_data().to_vec::<f32>().unwrap());
            }
        }
        let mut c = Collect(grads, vec![]);
        model.visit(&mut c);
        c.1
    }

    /// The gradients of the mean loss over `rows` rows of `ids`, in
    /// `parts` passes run [`concurrent_passes`] on two threads.
    fn gradients(model: &crate::PolicyModel<Ad>, ids: &[i64], [rows, len]: [usize; 2], parts: usize) -> Vec<f32> {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        pool.install(|| {
            assert_eq!(<Ad as ScoringBackend>::passes_at_once(), 2);
            let work: Vec<&[i64]> = ids.chunks(rows.div_ceil(parts) * len).collect();
            let grads = concurrent_passes(model, work, |m: &crate::PolicyModel<Ad>, part: &[i64]| {
                let share = part.len() as f64 / ids.len() as f64;
                let loss = next_token_loss(m, part, [part.len() / len, len], &Default::default()) * share;
                GradientsParams::from_grads(loss.backward(), m)
            });
            flat(model, &sum_gradients(model, grads))
        })
    }

    #[test]
    fn passes_at_once_add_up_to_the_gradients_of_one_pass() {
        let device = Default::default();
        let model = PolicyModelConfig::new(23).with_d_model(16).with_n_heads(2).with_max_seq_len(32).init::<Ad>(&device);
        let [rows, len] = [5, 12];
        let ids: Vec<i64> = (0..rows * len).map(|i| (i * 7 % 23) as i64).collect();
        let one = gradients(&model, &ids, [rows, len], 1);
        let three = gradients(&model, &ids, [rows, len], 3);
        assert_eq!(one.len(), three.len());
        let scale = one.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.0);
        for (i, (a, b)) in one.iter().zip(&three).enumerate() {
            assert!((a - b).abs() <= 1e-5 * scale, "gradient {i}: {a} in one pass, {b} in three at once");
        }
        // The same passes give the same bits, whichever thread ran which.
        assert_eq!(three, gradients(&model, &ids, [rows, len], 3));
    }
}
