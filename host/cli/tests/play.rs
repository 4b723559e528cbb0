//! `ragen-host play`, driven through stdin as a person at a terminal would.

mod common;

use common::{play, plugin};

#[test]
fn a_person_solves_a_fixed_sokoban_level() {
    let level = "level=#######\n#P_X_O#\n#######";
    let (ok, screen) = play(&[plugin("sokoban").to_str().unwrap(), "--set", level], "right || RIGHT\nfly\nright\nquit\n");
    assert!(ok, "{screen}");
    assert!(screen.contains("Actions: Up, Down, Left, Right"), "{screen}");
    assert!(screen.contains("#######\n#P_X_O#\n#######"), "the first state is shown:\n{screen}");
    assert!(screen.contains("Right: reward -0.1"), "{screen}");
    assert!(screen.contains("#__PXO#"), "two moves in one line, in order:\n{screen}");
    assert!(screen.contains("unknown action `fly`"), "{screen}");
    assert!(screen.contains("done true, success true"), "{screen}");
    assert!(screen.contains("Episode over (solved), return 10.70"), "{screen}");
}

#[test]
fn reset_and_end_of_input() {
    let (ok, screen) = play(&[plugin("frozenlake").to_str().unwrap(), "--seed", "4"], "reset 9\nreset\n");
    assert!(ok, "{screen}");
    assert!(
        screen.contains("Episode with seed 4:") && screen.contains("Episode with seed 9:") && screen.contains("Episode with seed 10:"),
        "{screen}"
    );
}

#[test]
fn the_bandit_is_one_pull() {
    let (ok, screen) = play(&[plugin("bandit").to_str().unwrap()], "phoenix\nphoenix\n");
    assert!(ok, "{screen}");
    assert!(screen.contains("Phoenix: reward 0.1"), "{screen}");
    assert!(screen.contains("step called after the episode ended"), "a second pull is refused:\n{screen}");
}
