//! The Sokoban board and its one rule: the player walks, and pushes (never
//! pulls) a single box into a free cell.

/// The fixed part of a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tile {
    Wall,
    Floor,
    Target,
}

/// A move direction; action id = position in [`Dir::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Up,
    Down,
    Left,
    Right,
}

impl Dir {
    pub const ALL: [Dir; 4] = [Dir::Up, Dir::Down, Dir::Left, Dir::Right];

    pub fn name(self) -> &'static str {
        match self {
            Dir::Up => "Up",
            Dir::Down => "Down",
            Dir::Left => "Left",
            Dir::Right => "Right",
        }
    }

    pub fn from_action(action: u32) -> Dir {
        Dir::ALL[action as usize]
    }

    pub fn action(self) -> u32 {
        Dir::ALL.iter().position(|d| *d == self).unwrap() as u32
    }
}

/// What a push-move did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moved {
    pub player: bool,
    pub boxed: bool,
}

/// A room: walls, floor and targets, plus where the boxes and player are.
/// Cells are indexed row-major; coordinates outside the grid behave as walls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Room {
    width: usize,
    height: usize,
    tiles: Vec<Tile>,
    boxes: Vec<bool>,
    player: usize,
}

impl Room {
    /// A room from its parts; `tiles` and `boxes` are row-major, `width * height` long.
    pub fn new(width: usize, height: usize, tiles: Vec<Tile>, boxes: Vec<bool>, player: usize) -> Self {
        assert_eq!(tiles.len(), width * height);
        assert_eq!(boxes.len(), width * height);
        assert!(player < tiles.len());
        Self { width, height, tiles, boxes, player }
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn height(&self) -> usize {
        self.height
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

    pub fn has_box(&self, cell: usize) -> bool {
        self.boxes[cell]
    }

    pub fn player(&self) -> usize {
        self.player
    }

    /// Each row's tiles and box flags, top to bottom.
    pub fn rows(&self) -> impl Iterator<Item = (&[Tile], &[bool])> {
        self.tiles.chunks(self.width).zip(self.boxes.chunks(self.width))
    }

    /// The cell next to `cell` in direction `dir`, if it is inside the grid.
    pub fn neighbor(&self, cell: usize, dir: Dir) -> Option<usize> {
        let (r, c) = (cell / self.width, cell % self.width);
        match dir {
            Dir::Up if r > 0 => Some(cell - self.width),
            Dir::Down if r + 1 < self.height => Some(cell + self.width),
            Dir::Left if c > 0 => Some(cell - 1),
            Dir::Right if c + 1 < self.width => Some(cell + 1),
            _ => None,
        }
    }

    /// Free for a player or box to enter: inside, not a wall, no box.
    pub fn is_free(&self, cell: usize) -> bool {
        self.tiles[cell] != Tile::Wall && !self.boxes[cell]
    }

    /// Box cells, ascending.
    pub fn box_cells(&self) -> Vec<usize> {
        (0..self.len()).filter(|&c| self.boxes[c]).collect()
    }

    pub fn target_cells(&self) -> Vec<usize> {
        (0..self.len()).filter(|&c| self.tiles[c] == Tile::Target).collect()
    }

    pub fn num_boxes(&self) -> usize {
        self.boxes.iter().filter(|b| **b).count()
    }

    pub fn boxes_on_target(&self) -> usize {
        (0..self.len()).filter(|&c| self.boxes[c] && self.tiles[c] == Tile::Target).count()
    }

    pub fn is_solved(&self) -> bool {
        self.boxes_on_target() == self.num_boxes()
    }

    /// Move the player one cell, pushing a box if one is in the way and the
    /// cell behind it is free. Walls, the grid's edge and a blocked box stop
    /// the move entirely.
    pub fn push_move(&mut self, dir: Dir) -> Moved {
        let still = Moved { player: false, boxed: false };
        let Some(next) = self.neighbor(self.player, dir) else { return still };
        if self.tiles[next] == Tile::Wall {
            return still;
        }
        if self.boxes[next] {
            let Some(beyond) = self.neighbor(next, dir) else { return still };
            if !self.is_free(beyond) {
                return still;
            }
            self.boxes[next] = false;
            self.boxes[beyond] = true;
            self.player = next;
            return Moved { player: true, boxed: true };
        }
        self.player = next;
        Moved { player: true, boxed: false }
    }

    /// Place the player (generation and tests); `cell` must be free.
    pub fn set_player(&mut self, cell: usize) {
        debug_assert!(self.is_free(cell));
        self.player = cell;
    }
}
