import PushCore

/// What the CLI prints reaches an operator's terminal, and much of it comes from the database: topics,
/// reasons, errors, collapse ids, credential and worker names, which producers (or anyone with INSERT on
/// `push.dead_jobs`) wrote. A control character there is an instruction to the terminal: ESC sequences can
/// rewrite the screen, hide the lines before them, retitle the window, or (in some terminals) answer back
/// on the operator's input. So every line the executable prints goes through `HumanText.escaped`:
/// control characters and the bidirectional overrides that reorder what is shown are printed as `\u{1B}`.
/// Newlines and tabs stay (tables and multi-line output need them). JSON output is unchanged: JSON escapes
/// control characters itself.
/// The executable's `print`: `Swift.print` with `HumanText.escaped` applied, so no print in this
/// module can pass a control character from the database to the terminal.
func print(_ items: Any..., separator: String = " ", terminator: String = "\n") {
    Swift.print(HumanText.escaped(items.map { "\($0)" }.joined(separator: separator)), terminator: terminator)
}
