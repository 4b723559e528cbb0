//! Room generation, after gym-sokoban (the reference's generator): a random
//! walk carves the room, targets and player are dropped on the floor, and a
//! depth-first *reverse* play (the player pulls boxes off their targets)
//! keeps the state that scatters the boxes most. Every room is solvable by
//! construction: play the pulls backwards as pushes.
//!
//! Where Python's version hashes a pickled numpy array per state, this one
//! packs (player, sorted boxes) into a `u128` and keeps the search on an
//! explicit stack with fixed-size frames, so a 6x6 room takes microseconds.

use crate::room::{Dir, Room, Tile};
use ragen_env_sdk::SeedRng;
use rustc_hash::FxHashSet;

/// Most boxes the generator (and the packed state key) supports.
pub const MAX_BOXES: usize = 9;
/// Explored-state cap of the reverse search, as in the reference.
const MAX_EXPLORED: usize = 300_000;
/// Tries per attempt before the seed is re-derived (the reference's `tries`).
const TRIES: usize = 4;
/// Re-derived seeds before reset gives up.
const ATTEMPTS: u64 = 64;
const P_CHANGE_DIRECTION: f64 = 0.35;

/// Pack a player cell and box cells into one key; cells must be < 4096.
pub(crate) fn state_key(player: usize, boxes: &[u16]) -> u128 {
    let mut sorted = [0u16; MAX_BOXES];
    sorted[..boxes.len()].copy_from_slice(boxes);
    sorted[..boxes.len()].sort_unstable();
    sorted[..boxes.len()].iter().fold(player as u128, |key, &b| (key << 12) | b as u128)
}

/// A generated room and the reverse-play score it was chosen with.
#[derive(Clone, Debug)]
pub struct Generated {
    pub room: Room,
    pub score: u32,
}

/// Generate a `width` x `height` room with `num_boxes` boxes from `seed`.
/// Deterministic: the same arguments always give the same room.
pub fn generate(seed: u64, width: usize, height: usize, num_boxes: usize, search_depth: u32) -> Result<Generated, String> {
    assert!((1..=MAX_BOXES).contains(&num_boxes));
    for attempt in 0..ATTEMPTS {
        let mut rng = SeedRng::stream(seed, attempt);
        for _ in 0..TRIES {
            let tiles = topology(&mut rng, width, height);
            let Some((tiles, player)) = place(&mut rng, tiles, num_boxes) else { break };
            let (room, score) = reverse_play(width, height, tiles, player, search_depth);
            if score > 0 {
                let room = nudge_player(&mut rng, room, score);
                return Ok(Generated { room, score });
            }
        }
    }
    Err(format!(
        "no solvable {width}x{height} room with {num_boxes} boxes found for seed {seed} after {ATTEMPTS} attempts; \
         use fewer boxes, a larger room or a larger search_depth"
    ))
}

/// Step 1: a random walk stamping 3x3 masks of floor; the border stays wall.
fn topology(rng: &mut SeedRng, width: usize, height: usize) -> Vec<Tile> {
    // (row, col) offsets; masks are 3x3, row-major, 1 = floor.
    const DIRECTIONS: [(isize, isize); 4] = [(1, 0), (0, 1), (-1, 0), (0, -1)];
    const MASKS: [[u8; 9]; 5] = [
        [0, 0, 0, 1, 1, 1, 0, 0, 0],
        [0, 1, 0, 0, 1, 0, 0, 1, 0],
        [0, 0, 0, 1, 1, 0, 0, 1, 0],
        [0, 0, 0, 1, 1, 0, 1, 1, 0],
        [0, 0, 0, 0, 1, 1, 0, 1, 0],
    ];
    let num_steps = (1.7 * (width + height) as f64) as usize;
    let mut floor = vec![false; width * height];
    let mut dir = *rng.choose(&DIRECTIONS).unwrap();
    // Python's randint(1, dim - 1) is inclusive; the first step clamps it.
    let mut row = 1 + rng.below(height - 1) as isize;
    let mut col = 1 + rng.below(width - 1) as isize;
    for _ in 0..num_steps {
        if rng.chance(P_CHANGE_DIRECTION) {
            dir = *rng.choose(&DIRECTIONS).unwrap();
        }
        row = (row + dir.0).clamp(1, height as isize - 2);
        col = (col + dir.1).clamp(1, width as isize - 2);
        let mask = rng.choose(&MASKS).unwrap();
        for (i, &m) in mask.iter().enumerate() {
            if m == 1 {
                let (r, c) = ((row - 1) as usize + i / 3, (col - 1) as usize + i % 3);
                floor[r * width + c] = true;
            }
        }
    }
    (0..width * height)
        .map(|cell| {
            let (r, c) = (cell / width, cell % width);
            let border = r == 0 || c == 0 || r == height - 1 || c == width - 1;
            if floor[cell] && !border { Tile::Floor } else { Tile::Wall }
        })
        .collect()
}

/// Step 2: the player, then one target per box, on distinct floor cells.
/// `None` when the walk left too little floor.
fn place(rng: &mut SeedRng, mut tiles: Vec<Tile>, num_boxes: usize) -> Option<(Vec<Tile>, usize)> {
    let mut free: Vec<usize> = (0..tiles.len()).filter(|&c| tiles[c] == Tile::Floor).collect();
    if free.len() <= num_boxes + 1 {
        return None;
    }
    let player = free.remove(rng.below(free.len()));
    for _ in 0..num_boxes {
        let target = free.remove(rng.below(free.len()));
        tiles[target] = Tile::Target;
    }
    Some((tiles, player))
}

/// One node of the reverse search.
#[derive(Clone, Copy)]
struct Frame {
    player: u16,
    /// `boxes[i]` is where the box that started on target `i` is now.
    boxes: [u16; MAX_BOXES],
    /// Pulls on the path here. (The reference calls it `box_swaps`, but as
    /// written it counts every pull; we keep its behaviour.)
    pulls: u32,
    /// Depth budget left after entering this node.
    ttl: u32,
    /// The next of the 8 reverse actions to try.
    next_action: u8,
}

/// Step 3: depth-first reverse play from boxes-on-targets; returns the room
/// with the best score (pulls x total box displacement), 0 when no state
/// left every target uncovered.
fn reverse_play(width: usize, height: usize, tiles: Vec<Tile>, player: usize, search_depth: u32) -> (Room, u32) {
    let targets: Vec<usize> = (0..tiles.len()).filter(|&c| tiles[c] == Tile::Target).collect();
    let n = targets.len();
    let mut root = Frame { player: player as u16, boxes: [0; MAX_BOXES], pulls: 0, ttl: search_depth.saturating_sub(1), next_action: 0 };
    for (i, &t) in targets.iter().enumerate() {
        root.boxes[i] = t as u16;
    }
    let has_box = |f: &Frame, cell: usize| f.boxes[..n].iter().any(|&b| b as usize == cell);
    let step = |cell: usize, dir: Dir| -> Option<usize> {
        let (r, c) = (cell / width, cell % width);
        match dir {
            Dir::Up if r > 0 => Some(cell - width),
            Dir::Down if r + 1 < height => Some(cell + width),
            Dir::Left if c > 0 => Some(cell - 1),
            Dir::Right if c + 1 < width => Some(cell + 1),
            _ => None,
        }
    };
    let opposite = |d: Dir| match d {
        Dir::Up => Dir::Down,
        Dir::Down => Dir::Up,
        Dir::Left => Dir::Right,
        Dir::Right => Dir::Left,
    };
    let score = |f: &Frame| -> u32 {
        let covered = targets.iter().any(|&t| f.player as usize == t || has_box(f, t));
        if covered {
            return 0;
        }
        let displacement: usize = (0..n)
            .map(|i| {
                let (a, b) = (targets[i], f.boxes[i] as usize);
                (a / width).abs_diff(b / width) + (a % width).abs_diff(b % width)
            })
            .sum();
        f.pulls * displacement as u32
    };

    let mut explored: FxHashSet<u128> = FxHashSet::default();
    let mut best = (root, 0u32);
    let mut best_score: i64 = -1;
    let mut stack: Vec<Frame> = Vec::with_capacity(search_depth.min(4096) as usize);
    // Entering a node: the reference's checks at the top of its recursion.
    let mut enter = |f: Frame, stack: &mut Vec<Frame>, explored: &mut FxHashSet<u128>| {
        if f.ttl == 0 || explored.len() >= MAX_EXPLORED {
            return;
        }
        if !explored.insert(state_key(f.player as usize, &f.boxes[..n])) {
            return;
        }
        let s = score(&f);
        if s as i64 > best_score {
            best_score = s as i64;
            best = (f, s);
        }
        stack.push(f);
    };
    enter(root, &mut stack, &mut explored);
    while let Some(top) = stack.last_mut() {
        if top.next_action == 8 {
            stack.pop();
            continue;
        }
        let action = top.next_action;
        top.next_action += 1;
        let parent = *top;
        let dir = Dir::ALL[(action % 4) as usize];
        let mut child = Frame { ttl: parent.ttl - 1, next_action: 0, ..parent };
        let from = parent.player as usize;
        if let Some(to) = step(from, dir).filter(|&c| tiles[c] != Tile::Wall && !has_box(&parent, c)) {
            child.player = to as u16;
            // Actions 0..4 also pull the box behind the player, if any.
            if action < 4
                && let Some(behind) = step(from, opposite(dir))
                && let Some(i) = (0..n).find(|&i| parent.boxes[i] as usize == behind)
            {
                child.boxes[i] = from as u16;
                child.pulls += 1;
            }
        }
        enter(child, &mut stack, &mut explored);
    }

    let (f, s) = best;
    let mut boxes = vec![false; tiles.len()];
    for &b in &f.boxes[..n] {
        boxes[b as usize] = true;
    }
    (Room::new(width, height, tiles, boxes, f.player as usize), s)
}

/// Step 5 (RAGEN's addition): walk the player 1-3 random steps onto free
/// cells, so the first move is less often the winning push. Walking never
/// pushes, so the room stays solvable.
fn nudge_player(rng: &mut SeedRng, mut room: Room, score: u32) -> Room {
    let p = if score == 1 { 0.8 } else { 0.5 };
    if !rng.chance(p) {
        return room;
    }
    for _ in 0..3 {
        let free: Vec<usize> = Dir::ALL.iter().filter_map(|&d| room.neighbor(room.player(), d)).filter(|&c| room.is_free(c)).collect();
        let Some(&cell) = rng.choose(&free) else { break };
        room.set_player(cell);
        if !rng.chance(0.5) {
            break;
        }
    }
    room
}
