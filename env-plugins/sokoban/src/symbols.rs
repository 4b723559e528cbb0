//! Text in and out: the configurable symbol table used to render states and
//! read fixed levels, and the standard XSB notation of Boxoban files.

use crate::room::{Room, Tile};
use ragen_env_sdk::LegendEntry;

/// One symbol per kind of cell. The default is RAGEN's; the reference's
/// generalisation test swaps in another vocabulary (`W.GBCA@`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbols {
    pub wall: char,
    pub floor: char,
    pub target: char,
    pub box_: char,
    pub box_on_target: char,
    pub player: char,
    pub player_on_target: char,
}

/// The kinds in the order the `symbols` config string lists them.
const MEANINGS: [&str; 7] = ["wall", "empty", "target", "box", "box on target", "player", "player on target"];

impl Symbols {
    pub const DEFAULT: &'static str = "#_OX√PS";

    /// Parse seven distinct characters in the order wall, floor, target, box,
    /// box on target, player, player on target.
    pub fn parse(s: &str) -> Result<Self, String> {
        let c: Vec<char> = s.chars().collect();
        if c.len() != 7 {
            return Err(format!(
                "`{s}` has {} characters; give 7, one each for {} (default `{}`)",
                c.len(),
                MEANINGS.join(", "),
                Self::DEFAULT
            ));
        }
        for (i, a) in c.iter().enumerate() {
            if a.is_whitespace() || c[..i].contains(a) {
                return Err(format!("`{s}`: each of the 7 symbols must be distinct and not whitespace"));
            }
        }
        Ok(Self { wall: c[0], floor: c[1], target: c[2], box_: c[3], box_on_target: c[4], player: c[5], player_on_target: c[6] })
    }

    fn all(&self) -> [char; 7] {
        [self.wall, self.floor, self.target, self.box_, self.box_on_target, self.player, self.player_on_target]
    }

    pub fn legend(&self) -> Vec<LegendEntry> {
        self.all().iter().zip(MEANINGS).map(|(s, m)| LegendEntry::new(s, m)).collect()
    }

    /// Rows of one symbol per cell, joined by `\n`. This runs on every step,
    /// so it walks the rows' slices directly instead of indexing cell by cell.
    pub fn render(&self, room: &Room) -> String {
        let mut out = String::with_capacity(room.len() * 3 + room.height());
        let player = (room.player() / room.width(), room.player() % room.width());
        for (r, (tiles, boxes)) in room.rows().enumerate() {
            if r > 0 {
                out.push('\n');
            }
            for (c, (&tile, &boxed)) in tiles.iter().zip(boxes).enumerate() {
                let target = tile == Tile::Target;
                out.push(match () {
                    _ if (r, c) == player => {
                        if target {
                            self.player_on_target
                        } else {
                            self.player
                        }
                    }
                    _ if boxed => {
                        if target {
                            self.box_on_target
                        } else {
                            self.box_
                        }
                    }
                    _ => match tile {
                        Tile::Wall => self.wall,
                        Tile::Floor => self.floor,
                        Tile::Target => self.target,
                    },
                });
            }
        }
        out
    }

    /// Read a level written in these symbols.
    pub fn parse_level(&self, text: &str) -> Result<Room, String> {
        parse_grid(text, |ch| {
            let i = self.all().iter().position(|s| *s == ch)?;
            Some(CELLS[i])
        })
    }
}

/// (tile, box, player) for wall, floor, target, box, box on target, player,
/// player on target: the same order as [`Symbols`].
const CELLS: [(Tile, bool, bool); 7] = [
    (Tile::Wall, false, false),
    (Tile::Floor, false, false),
    (Tile::Target, false, false),
    (Tile::Floor, true, false),
    (Tile::Target, true, false),
    (Tile::Floor, false, true),
    (Tile::Target, false, true),
];

/// Decode one XSB character (the notation of Boxoban and most level files).
fn xsb(ch: char) -> Option<(Tile, bool, bool)> {
    let i = match ch {
        '#' => 0,
        ' ' | '-' | '_' => 1,
        '.' => 2,
        '$' => 3,
        '*' => 4,
        '@' => 5,
        '+' => 6,
        _ => return None,
    };
    Some(CELLS[i])
}

/// Read a Boxoban-style file: levels in XSB notation, each introduced by a
/// `; <number>` comment line, separated by blank lines.
pub fn parse_boxoban(text: &str) -> Result<Vec<Room>, String> {
    let mut levels = Vec::new();
    let mut block: Vec<&str> = Vec::new();
    let flush = |block: &mut Vec<&str>, levels: &mut Vec<Room>| -> Result<(), String> {
        if !block.is_empty() {
            let room = parse_grid(&block.join("\n"), xsb).map_err(|e| format!("level {}: {e}", levels.len()))?;
            levels.push(room);
            block.clear();
        }
        Ok(())
    };
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.starts_with(';') || line.trim().is_empty() {
            flush(&mut block, &mut levels)?;
        } else {
            block.push(line);
        }
    }
    flush(&mut block, &mut levels)?;
    if levels.is_empty() {
        return Err("no levels found; expected XSB levels (`#`, ` `, `.`, `$`, `*`, `@`, `+`) separated by `; N` lines".into());
    }
    Ok(levels)
}

/// Shared grid reader: rows split on newlines, ragged rows padded with wall,
/// exactly one player, as many boxes as targets. Floor the player cannot
/// reach (XSB's spaces outside the outer wall) becomes wall so it renders as
/// such.
fn parse_grid(text: &str, decode: impl Fn(char) -> Option<(Tile, bool, bool)>) -> Result<Room, String> {
    let rows: Vec<&str> = text.split('\n').map(|r| r.trim_end_matches('\r')).filter(|r| !r.is_empty()).collect();
    if rows.is_empty() {
        return Err("the level is empty".into());
    }
    let width = rows.iter().map(|r| r.chars().count()).max().unwrap();
    let height = rows.len();
    if width > 64 || height > 64 {
        return Err(format!("the level is {width}x{height}; at most 64x64 is supported"));
    }
    let mut tiles = vec![Tile::Wall; width * height];
    let mut boxes = vec![false; width * height];
    let mut players = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        for (c, ch) in row.chars().enumerate() {
            let (tile, boxed, player) = decode(ch).ok_or_else(|| format!("unknown symbol `{ch}` at row {}, column {}", r + 1, c + 1))?;
            let cell = r * width + c;
            tiles[cell] = tile;
            boxes[cell] = boxed;
            if player {
                players.push(cell);
            }
        }
    }
    let [player] = players[..] else {
        return Err(format!("the level has {} players; it needs exactly one", players.len()));
    };
    let mut room = Room::new(width, height, tiles.clone(), boxes.clone(), player);
    let (n_boxes, n_targets) = (room.num_boxes(), room.target_cells().len());
    if n_boxes == 0 || n_boxes != n_targets {
        return Err(format!(
            "the level has {n_boxes} boxes and {n_targets} targets; it needs at least one box and as many targets as boxes"
        ));
    }
    // Wall off floor outside the player's region (walking through boxes).
    let mut seen = vec![false; tiles.len()];
    let mut stack = vec![player];
    seen[player] = true;
    while let Some(cell) = stack.pop() {
        for dir in crate::room::Dir::ALL {
            if let Some(n) = room.neighbor(cell, dir)
                && !seen[n]
                && tiles[n] != Tile::Wall
            {
                seen[n] = true;
                stack.push(n);
            }
        }
    }
    for cell in 0..tiles.len() {
        if !seen[cell] && tiles[cell] == Tile::Floor && !boxes[cell] {
            tiles[cell] = Tile::Wall;
        }
    }
    room = Room::new(width, height, tiles, boxes, player);
    Ok(room)
}
