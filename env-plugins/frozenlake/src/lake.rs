//! The lake: a grid of frozen tiles, holes, a start and a goal, and how a
//! move (maybe slipping) lands.

use ragen_env_sdk::SeedRng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tile {
    Frozen,
    Hole,
    Goal,
}

/// Move directions in the reference's (gymnasium's) order; action id =
/// position in [`Dir::ALL`]. Rotating by one (`(a ± 1) % 4`) gives the two
/// perpendicular directions, which is how slipping is defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Left,
    Down,
    Right,
    Up,
}

impl Dir {
    pub const ALL: [Dir; 4] = [Dir::Left, Dir::Down, Dir::Right, Dir::Up];

    pub fn name(self) -> &'static str {
        match self {
            Dir::Left => "Left",
            Dir::Down => "Down",
            Dir::Right => "Right",
            Dir::Up => "Up",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The direction rotated by `k` quarter turns in the action order.
    pub fn rotated(self, k: usize) -> Dir {
        Dir::ALL[(self.index() + k) % 4]
    }
}

/// The square map and where the player starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lake {
    size: usize,
    tiles: Vec<Tile>,
    start: usize,
}

impl Lake {
    pub fn size(&self) -> usize {
        self.size
    }

    /// Cells in the grid (width × height).
    pub fn len(&self) -> usize {
        self.tiles.len()
    }

    /// Whether the grid has no cells (never, for a generated one).
    pub fn is_empty(&self) -> bool {
        self.tiles.is_empty()
    }

    pub fn tile(&self, cell: usize) -> Tile {
        self.tiles[cell]
    }

    pub fn start(&self) -> usize {
        self.start
    }

    pub fn goal(&self) -> usize {
        self.tiles.iter().position(|t| *t == Tile::Goal).unwrap()
    }

    /// Where a move from `cell` in `dir` lands; off the map stays put.
    pub fn moved(&self, cell: usize, dir: Dir) -> usize {
        let (r, c) = (cell / self.size, cell % self.size);
        match dir {
            Dir::Left if c > 0 => cell - 1,
            Dir::Right if c + 1 < self.size => cell + 1,
            Dir::Up if r > 0 => cell - self.size,
            Dir::Down if r + 1 < self.size => cell + self.size,
            _ => cell,
        }
    }

    /// True if the goal can be reached from the start without crossing a hole.
    pub fn goal_reachable(&self) -> bool {
        let mut seen = vec![false; self.len()];
        let mut stack = vec![self.start];
        seen[self.start] = true;
        while let Some(cell) = stack.pop() {
            if self.tiles[cell] == Tile::Goal {
                return true;
            }
            for dir in Dir::ALL {
                let next = self.moved(cell, dir);
                if !seen[next] && self.tiles[next] != Tile::Hole {
                    seen[next] = true;
                    stack.push(next);
                }
            }
        }
        false
    }

    /// The reference's generator: each tile frozen with probability `p`,
    /// start and goal on two random distinct cells, redrawn until the goal
    /// is reachable. `None` if `max_draws` maps were all unreachable.
    pub fn generate(rng: &mut SeedRng, size: usize, p: f64, max_draws: usize) -> Option<Lake> {
        for _ in 0..max_draws {
            let mut tiles: Vec<Tile> = (0..size * size).map(|_| if rng.chance(p) { Tile::Frozen } else { Tile::Hole }).collect();
            let start = rng.below(size * size);
            let mut goal = rng.below(size * size);
            while goal == start {
                goal = rng.below(size * size);
            }
            tiles[start] = Tile::Frozen;
            tiles[goal] = Tile::Goal;
            let lake = Lake { size, tiles, start };
            if lake.goal_reachable() {
                return Some(lake);
            }
        }
        None
    }

    /// Read a map in gymnasium's letters: `S` start, `F` frozen, `H` hole,
    /// `G` goal; rows separated by newlines (or `/`).
    pub fn parse(text: &str) -> Result<Lake, String> {
        let rows: Vec<&str> = text.split(['\n', '/']).map(str::trim).filter(|r| !r.is_empty()).collect();
        let size = rows.len();
        if size < 2 {
            return Err("the map needs at least 2 rows".into());
        }
        let mut tiles = Vec::with_capacity(size * size);
        let mut starts = Vec::new();
        for (r, row) in rows.iter().enumerate() {
            if row.chars().count() != size {
                return Err(format!("row {} has {} cells; the map must be square ({size}x{size})", r + 1, row.chars().count()));
            }
            for (c, ch) in row.chars().enumerate() {
                tiles.push(match ch.to_ascii_uppercase() {
                    'S' => {
                        starts.push(r * size + c);
                        Tile::Frozen
                    }
                    'F' => Tile::Frozen,
                    'H' => Tile::Hole,
                    'G' => Tile::Goal,
                    _ => return Err(format!("unknown tile `{ch}` at row {}, column {}; use S, F, H or G", r + 1, c + 1)),
                });
            }
        }
        let goals = tiles.iter().filter(|t| **t == Tile::Goal).count();
        let [start] = starts[..] else {
            return Err(format!("the map has {} starts (S); it needs exactly one", starts.len()));
        };
        if goals != 1 {
            return Err(format!("the map has {goals} goals (G); it needs exactly one"));
        }
        Ok(Lake { size, tiles, start })
    }
}
