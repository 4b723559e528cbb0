use super::*;
use ragen_env_sdk::{CheckedEnv, ErrorKind};
use room::Tile;

fn level(text: &str) -> CheckedEnv<Sokoban> {
    let mut env = CheckedEnv::with(&[("level", text)]).unwrap();
    env.reset(0).unwrap();
    env
}

const RIGHT: u32 = 3;
const LEFT: u32 = 2;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn pushes_a_box_and_pays_the_reference_rewards() {
    let mut env = level("#######\n#P_X_O#\n#######");
    let walk = env.step(RIGHT).unwrap();
    assert_eq!(walk.observation, "#######\n#_PX_O#\n#######");
    assert!(close(walk.reward, -0.1) && walk.info.action_is_effective && !walk.done);
    let push = env.step(RIGHT).unwrap();
    assert_eq!(push.observation, "#######\n#__PXO#\n#######");
    assert!(close(push.reward, -0.1));
    let win = env.step(RIGHT).unwrap();
    assert_eq!(win.observation, "#######\n#___P√#\n#######");
    assert!(close(win.reward, -0.1 + 1.0 + 10.0), "{}", win.reward);
    assert!(win.done && win.info.success);
    assert_eq!(win.info.metrics, [1.0]);
    assert_eq!(env.step(RIGHT).unwrap_err().kind, ErrorKind::EpisodeOver);
}

#[test]
fn a_box_against_a_wall_does_not_move() {
    let mut env = level("######\n#PX#O#\n######");
    let out = env.step(RIGHT).unwrap();
    assert_eq!(out.observation, "######\n#PX#O#\n######");
    assert!(!out.info.action_is_effective && out.info.action_is_valid);
    assert!(close(out.reward, -0.1));
    // Walking into a wall is the same no-op.
    assert!(!env.step(LEFT).unwrap().info.action_is_effective);
}

#[test]
fn a_box_against_a_box_does_not_move() {
    let mut env = level("#######\n#PXX_O#\n#____O#\n#######");
    let out = env.step(RIGHT).unwrap();
    assert_eq!(out.observation, "#######\n#PXX_O#\n#____O#\n#######");
    assert!(!out.info.action_is_effective);
}

#[test]
fn box_onto_and_off_a_target() {
    let mut env = level("########\n#PXO__O#\n#_____X#\n########");
    let on = env.step(RIGHT).unwrap();
    assert_eq!(on.observation, "########\n#_P√__O#\n#_____X#\n########");
    assert!(close(on.reward, -0.1 + 1.0) && !on.done && !on.info.success);
    let off = env.step(RIGHT).unwrap();
    assert_eq!(off.observation, "########\n#__SX_O#\n#_____X#\n########");
    assert!(close(off.reward, -0.1 - 1.0), "{}", off.reward);
    assert_eq!(off.info.metrics, [0.0]);
}

#[test]
fn player_on_target_renders_as_s() {
    let mut env = level("######\n#PO_X#\n######");
    assert_eq!(env.step(RIGHT).unwrap().observation, "######\n#_S_X#\n######");
    assert_eq!(env.step(RIGHT).unwrap().observation, "######\n#_OPX#\n######");
}

#[test]
fn episode_ends_unsolved_at_max_steps() {
    let mut env = CheckedEnv::<Sokoban>::with(&[("level", "######\n#PX_O#\n######"), ("max_steps", "3")]).unwrap();
    env.reset(0).unwrap();
    assert!(!env.step(LEFT).unwrap().done);
    assert!(!env.step(LEFT).unwrap().done);
    let last = env.step(LEFT).unwrap();
    assert!(last.done && !last.info.success);
    // A reset starts over.
    env.reset(0).unwrap();
    assert!(!env.step(LEFT).unwrap().done);
}

#[test]
fn the_vocabulary_is_configuration() {
    let mut env = CheckedEnv::<Sokoban>::with(&[("symbols", "W.GBCA@")]).unwrap();
    let obs = env.reset(5).unwrap();
    assert!(obs.chars().all(|c| "W.GBCA@\n".contains(c)), "{obs}");
    assert!(obs.contains('B') && obs.contains('G') && (obs.contains('A') || obs.contains('@')));
    let legend = env.spec().legend;
    assert_eq!(legend[0].symbol, "W");
    assert_eq!(legend[0].meaning, "wall");
    assert_eq!(legend[6].symbol, "@");

    let mut fixed = CheckedEnv::<Sokoban>::with(&[("symbols", "W.GBCA@"), ("level", "WWWWWW\nWAB.GW\nWWWWWW")]).unwrap();
    fixed.reset(0).unwrap();
    fixed.step(RIGHT).unwrap();
    let win = fixed.step(RIGHT).unwrap();
    assert_eq!(win.observation, "WWWWWW\nW..ACW\nWWWWWW");
    assert!(win.info.success);
}

#[test]
fn same_seed_same_room_and_seeds_differ() {
    let env = CheckedEnv::<Sokoban>::with(&[]).unwrap();
    let rooms: Vec<Room> = (0..50).map(|s| env.inner().initial_room(s).unwrap()).collect();
    for (s, room) in rooms.iter().enumerate() {
        assert_eq!(*room, env.inner().initial_room(s as u64).unwrap());
    }
    let distinct: std::collections::HashSet<String> = rooms.iter().map(|r| format!("{r:?}")).collect();
    assert!(distinct.len() >= 45, "only {} distinct rooms from 50 seeds", distinct.len());
}

#[test]
fn a_thousand_generated_rooms_are_all_solvable() {
    let env = CheckedEnv::<Sokoban>::with(&[]).unwrap();
    let mut lengths = Vec::new();
    for seed in 0..1000 {
        let room = env.inner().initial_room(seed).unwrap();
        assert_eq!((room.width(), room.height(), room.num_boxes()), (6, 6, 1));
        assert_eq!(room.boxes_on_target(), 0, "seed {seed} starts solved");
        let path = solver::solve(&room, 1_000_000).unwrap().unwrap_or_else(|| panic!("seed {seed} is unsolvable"));
        // Replaying the solution really solves the room.
        let mut play = room.clone();
        for d in &path {
            play.push_move(*d);
        }
        assert!(play.is_solved(), "seed {seed}: solution does not solve");
        lengths.push(path.len());
    }
    let mean = lengths.iter().sum::<usize>() as f64 / lengths.len() as f64;
    assert!(mean > 2.0, "rooms are trivial: mean solution length {mean}");
}

#[test]
fn larger_sokoban_rooms_are_solvable() {
    let env = CheckedEnv::<Sokoban>::with(&[("dim_x", "8"), ("dim_y", "8"), ("num_boxes", "2"), ("search_depth", "10")]).unwrap();
    for seed in 0..100 {
        let room = env.inner().initial_room(seed).unwrap();
        assert_eq!(room.num_boxes(), 2);
        assert!(solver::solve(&room, 2_000_000).unwrap().is_some(), "seed {seed}");
    }
}

#[test]
fn boxoban_levels_are_picked_by_seed() {
    let file = "; 0\n#####\n#@$.#\n#####\n\n; 1\n######\n#@ $.#\n######\n";
    let mut env = CheckedEnv::<Sokoban>::with(&[("levels", file)]).unwrap();
    assert_eq!(env.reset(0).unwrap(), "#####\n#PXO#\n#####");
    assert_eq!(env.reset(1).unwrap(), "######\n#P_XO#\n######");
    assert_eq!(env.reset(2).unwrap(), env.reset(0).unwrap());
    // The loaded level plays.
    env.reset(0).unwrap();
    assert!(env.step(RIGHT).unwrap().info.success);
}

#[test]
fn xsb_outside_the_walls_becomes_wall() {
    let file = "; 0\n  ####\n###@ #\n#  $.#\n######";
    let env = CheckedEnv::<Sokoban>::with(&[("levels", file)]).unwrap();
    let room = env.inner().initial_room(0).unwrap();
    assert_eq!(room.tile(0), Tile::Wall);
    assert_eq!(room.tile(1), Tile::Wall);
}

#[test]
fn bad_config_names_the_key() {
    for (settings, kind, key) in [
        (vec![("num_boxes", "20")], ErrorKind::BadValue, "num_boxes"),
        (vec![("dim_x", "5"), ("dim_y", "5"), ("num_boxes", "8")], ErrorKind::BadValue, "num_boxes"),
        (vec![("dim_x", "0")], ErrorKind::BadValue, "dim_x"),
        (vec![("dim_y", "tall")], ErrorKind::BadValue, "dim_y"),
        (vec![("symbols", "#_OX")], ErrorKind::BadValue, "symbols"),
        (vec![("symbols", "##OX√PS")], ErrorKind::BadValue, "symbols"),
        (vec![("level", "#####\n#P_O#\n#####")], ErrorKind::BadValue, "level"),
        (vec![("level", "#####\n#PXO#\n#####"), ("dim_x", "8")], ErrorKind::BadValue, "dim_x"),
        (vec![("level", "#####\n#PXO#\n#PXO#")], ErrorKind::BadValue, "level"),
        (vec![("levels", "; nothing here")], ErrorKind::BadValue, "levels"),
        (vec![("room_size", "6")], ErrorKind::UnknownKey, "room_size"),
    ] {
        let err = CheckedEnv::<Sokoban>::with(&settings).unwrap_err();
        assert_eq!(err.kind, kind, "{settings:?}: {}", err.message);
        assert!(err.message.contains(&format!("`{key}`")), "{settings:?}: {}", err.message);
    }
    // The num_boxes message says what fits.
    let err = CheckedEnv::<Sokoban>::with(&[("dim_x", "5"), ("dim_y", "5"), ("num_boxes", "8")]).unwrap_err();
    assert!(err.message.contains("use at most 7 boxes"), "{}", err.message);
}

#[test]
fn actions_and_limits_match_the_reference() {
    let spec = CheckedEnv::<Sokoban>::with(&[]).unwrap().spec();
    assert_eq!(spec.action_space.as_names(), ["Up", "Down", "Left", "Right"]);
    assert_eq!(spec.limits.max_actions_per_episode, 10);
    assert_eq!(spec.limits.max_steps, 100);
    assert_eq!(spec.metrics, ["boxes_on_target"]);
    let symbols: String = spec.legend.iter().map(|l| l.symbol.as_str()).collect();
    assert_eq!(symbols, "#_OX√PS");
}

#[test]
fn the_oracle_plays_a_shortest_solution_a_turn_at_a_time() {
    let mut env = CheckedEnv::<Sokoban>::with(&[]).unwrap();
    for seed in 0..8 {
        env.reset(seed).unwrap();
        let room = env.inner().room().unwrap().clone();
        let shortest = solver::solve(&room, ORACLE_MAX_STATES).unwrap().unwrap().len();
        let mut moves = 0;
        loop {
            let plan = env.best_actions(5).unwrap();
            assert!((1..=5).contains(&plan.len()), "{plan:?}");
            let mut done = false;
            for action in plan {
                let out = env.step(action).unwrap();
                moves += 1;
                if out.done {
                    assert!(out.info.success, "seed {seed}: the oracle's moves end the episode solved");
                    done = true;
                    break;
                }
            }
            if done {
                break;
            }
        }
        assert_eq!(moves, shortest, "seed {seed}");
    }
}
