//! Breadth-first search for a shortest solution (fewest moves). Used by
//! tests, by analysis (the optimal-policy bound) and for supervised warm
//! starts.

use crate::generate::{MAX_BOXES, state_key};
use crate::room::{Dir, Room, Tile};
use rustc_hash::FxHashSet;

/// Why the solver gave no answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SolveError {
    /// More boxes than the packed state key holds.
    TooManyBoxes(usize),
    /// The search visited `max_states` states without finishing.
    TooLarge { max_states: usize },
}

/// A compact search node: the walls and targets are the room's and never
/// change, so only the player and the (sorted) box cells are stored.
#[derive(Clone, Copy)]
struct Node {
    player: u16,
    boxes: [u16; MAX_BOXES],
    parent: u32,
    dir: Dir,
}

/// A shortest sequence of moves that solves `room`, `Ok(None)` if none
/// exists. Explores at most `max_states` states.
pub fn solve(room: &Room, max_states: usize) -> Result<Option<Vec<Dir>>, SolveError> {
    let n = room.num_boxes();
    if n > MAX_BOXES {
        return Err(SolveError::TooManyBoxes(n));
    }
    if room.is_solved() {
        return Ok(Some(vec![]));
    }
    let mut root = Node { player: room.player() as u16, boxes: [0; MAX_BOXES], parent: u32::MAX, dir: Dir::Up };
    for (i, c) in room.box_cells().into_iter().enumerate() {
        root.boxes[i] = c as u16;
    }
    let mut nodes = vec![root];
    let mut seen: FxHashSet<u128> = FxHashSet::default();
    seen.insert(state_key(root.player as usize, &root.boxes[..n]));
    let mut head = 0;
    while head < nodes.len() {
        let node = nodes[head];
        for dir in Dir::ALL {
            let Some(next) = room.neighbor(node.player as usize, dir) else { continue };
            if room.tile(next) == Tile::Wall {
                continue;
            }
            let mut child = Node { player: next as u16, parent: head as u32, dir, ..node };
            if let Some(i) = node.boxes[..n].iter().position(|&b| b as usize == next) {
                let Some(beyond) = room.neighbor(next, dir) else { continue };
                if room.tile(beyond) == Tile::Wall || node.boxes[..n].contains(&(beyond as u16)) {
                    continue;
                }
                child.boxes[i] = beyond as u16;
                child.boxes[..n].sort_unstable();
            }
            if !seen.insert(state_key(child.player as usize, &child.boxes[..n])) {
                continue;
            }
            nodes.push(child);
            if child.boxes[..n].iter().all(|&b| room.tile(b as usize) == Tile::Target) {
                let mut path = Vec::new();
                let mut at = nodes.len() - 1;
                while nodes[at].parent != u32::MAX {
                    path.push(nodes[at].dir);
                    at = nodes[at].parent as usize;
                }
                path.reverse();
                return Ok(Some(path));
            }
            if nodes.len() >= max_states {
                return Err(SolveError::TooLarge { max_states });
            }
        }
        head += 1;
    }
    Ok(None)
}
