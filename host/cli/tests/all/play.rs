//! `ragen-host play`, driven through stdin as a person at a terminal would.

use crate::common::{play, plugin};

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
    assert!(screen.contains("The episode is over: type `reset` for a new one"), "a second pull is refused:\n{screen}");
}

#[test]
fn a_person_answers_countdown_with_an_expression() {
    // Seed 3's puzzle, answered once wrongly and once by the solver's
    // expression (the whole line is the action, `||` and all).
    let file = plugin("countdown");
    let (ok, screen) = play(&[file.to_str().unwrap(), "--seed", "3"], "help\nquit\n");
    assert!(ok, "{screen}");
    assert!(screen.contains("Type your answer, one arithmetic expression"), "{screen}");
    let state = screen.lines().find(|l| l.starts_with("Target: ")).expect("the puzzle is shown").to_string();
    let target: u64 = state["Target: ".len()..state.find(',').unwrap()].parse().unwrap();
    let nums: Vec<u64> = state[state.find('[').unwrap() + 1..state.len() - 1].split(", ").map(|n| n.parse().unwrap()).collect();
    let answer = ragen_env_countdown::solver::solve(&nums, target).unwrap();
    let keys = format!("1 || 2\nreset 3\n{answer}\nquit\n");
    let (ok, screen) = play(&[file.to_str().unwrap(), "--seed", "3"], &keys);
    assert!(ok, "{screen}");
    assert!(screen.contains("1 || 2: reward 0"), "{screen}");
    assert!(screen.contains(&format!("{answer}: reward 1 ")) && screen.contains("Episode over (solved)"), "{screen}");
}
