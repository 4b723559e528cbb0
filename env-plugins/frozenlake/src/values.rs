//! Optimal play by value iteration: the probability of reaching the goal
//! within a step budget, and the moves that achieve it. This is the ceiling
//! a learned policy's success rate is read against.

use crate::lake::{Dir, Lake, Tile};

/// How the intended direction turns into the one taken.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slip {
    /// Probability of moving as intended; the two perpendicular directions
    /// share the rest equally. 1.0 = not slippery.
    pub success_rate: f64,
}

impl Slip {
    /// (direction taken, probability) for an intended direction, in the
    /// order intended, then each side.
    pub fn outcomes(self, dir: Dir) -> [(Dir, f64); 3] {
        let side = (1.0 - self.success_rate) / 2.0;
        [(dir, self.success_rate), (dir.rotated(3), side), (dir.rotated(1), side)]
    }
}

/// Optimal values and a policy that attains them.
#[derive(Clone, Debug)]
pub struct Values {
    /// `value[cell]`: best probability of reaching the goal from `cell`
    /// within the horizon.
    pub value: Vec<f64>,
    /// `policy[cell]`: a best first move from `cell` (for the full horizon).
    pub policy: Vec<Dir>,
}

/// Finite-horizon value iteration: `horizon` Bellman backups from zero.
/// Holes and the goal are terminal (value 0 and 1).
pub fn value_iteration(lake: &Lake, slip: Slip, horizon: u32) -> Values {
    let n = lake.len();
    let terminal_value = |cell: usize| match lake.tile(cell) {
        Tile::Goal => Some(1.0),
        Tile::Hole => Some(0.0),
        Tile::Frozen => None,
    };
    let mut value: Vec<f64> = (0..n).map(|c| terminal_value(c).unwrap_or(0.0)).collect();
    let mut policy = vec![Dir::Left; n];
    for _ in 0..horizon {
        let prev = value.clone();
        for cell in 0..n {
            if terminal_value(cell).is_some() {
                continue;
            }
            let (mut best, mut best_dir) = (-1.0, Dir::Left);
            for dir in Dir::ALL {
                let q: f64 = slip.outcomes(dir).iter().map(|&(d, p)| p * prev[lake.moved(cell, d)]).sum();
                if q > best + 1e-12 {
                    (best, best_dir) = (q, dir);
                }
            }
            value[cell] = best;
            policy[cell] = best_dir;
        }
    }
    Values { value, policy }
}
