//! Finds an expression that uses every number once and reaches the target,
//! by exact search over rationals (at most four numbers: a few thousand
//! combinations). It gives `eval` its optimal bound and the plugin's
//! oracle its answers.

/// An exact fraction, kept in lowest terms with a positive denominator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ratio {
    num: i128,
    den: i128,
}

impl Ratio {
    fn new(num: i128, den: i128) -> Option<Self> {
        if den == 0 {
            return None;
        }
        let g = gcd(num.unsigned_abs(), den.unsigned_abs()).max(1) as i128;
        let sign = if den < 0 { -1 } else { 1 };
        Some(Self { num: sign * num / g, den: sign * den / g })
    }
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// One value under construction and the text that computes it.
#[derive(Clone, Debug)]
struct Item {
    value: Ratio,
    text: String,
}

/// An expression over `numbers`, each used exactly once, whose value is
/// `target`, written with `+ - * /` and full parentheses; `None` if there
/// is none.
///
/// # Examples
///
/// ```
/// use ragen_env_countdown::{expr, solver};
/// let answer = solver::solve(&[3, 5, 2], 16).unwrap();
/// assert_eq!(expr::score(&answer, &[3, 5, 2], 16, 0.1), 1.0);
/// assert_eq!(solver::solve(&[1, 1], 7), None);
/// ```
pub fn solve(numbers: &[u64], target: u64) -> Option<String> {
    let items: Vec<Item> = numbers.iter().map(|&n| Item { value: Ratio { num: n as i128, den: 1 }, text: n.to_string() }).collect();
    let goal = Ratio { num: target as i128, den: 1 };
    search(items, goal)
}

fn search(items: Vec<Item>, goal: Ratio) -> Option<String> {
    if items.len() == 1 {
        return (items[0].value == goal).then(|| items[0].text.clone());
    }
    for i in 0..items.len() {
        for j in 0..items.len() {
            if i == j {
                continue;
            }
            let (a, b) = (&items[i], &items[j]);
            let rest: Vec<Item> = items.iter().enumerate().filter(|&(k, _)| k != i && k != j).map(|(_, it)| it.clone()).collect();
            for (op, value) in combine(a.value, b.value) {
                let text = if rest.is_empty() { format!("{} {op} {}", a.text, b.text) } else { format!("({} {op} {})", a.text, b.text) };
                let mut next = rest.clone();
                next.push(Item { value, text });
                if let Some(found) = search(next, goal) {
                    return Some(found);
                }
            }
        }
    }
    None
}

/// `a op b` for each operator that gives a value (`+` and `*` once per
/// unordered pair is enough, but the ordered loop above tries both orders
/// anyway; the cost is negligible at four numbers).
fn combine(a: Ratio, b: Ratio) -> Vec<(char, Ratio)> {
    let mut out = Vec::with_capacity(4);
    let sums = [
        ('+', Ratio::new(a.num * b.den + b.num * a.den, a.den * b.den)),
        ('-', Ratio::new(a.num * b.den - b.num * a.den, a.den * b.den)),
        ('*', Ratio::new(a.num * b.num, a.den * b.den)),
        ('/', Ratio::new(a.num * b.den, a.den * b.num)),
    ];
    for (op, r) in sums {
        if let Some(r) = r {
            out.push((op, r));
        }
    }
    out
}
