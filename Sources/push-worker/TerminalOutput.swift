/// What the CLI prints reaches an operator's terminal, and much of it comes from the database: topics,
/// reasons, errors, collapse ids, credential and worker names, which producers (or anyone with INSERT on
/// `push.dead_jobs`) wrote. A control character there is an instruction to the terminal: ESC sequences can
/// rewrite the screen, hide the lines before them, retitle the window, or (in some terminals) answer back
/// on the operator's input. So every line the executable prints goes through ``TerminalText/escaped(_:)``:
/// control characters and the bidirectional overrides that reorder what is shown are printed as `\u{1B}`.
/// Newlines and tabs stay (tables and multi-line output need them). JSON output is unchanged: JSON escapes
/// control characters itself.
enum TerminalText {
    /// `text` with every character a terminal would act on written as `\u{XX}`.
    static func escaped(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: Self.isUnsafe) else { return text }
        var result = ""
        result.reserveCapacity(text.utf8.count + 16)
        for scalar in text.unicodeScalars {
            if Self.isUnsafe(scalar) {
                result += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
            } else {
                result.unicodeScalars.append(scalar)
            }
        }
        return result
    }

    /// C0 controls but newline and tab, DEL, C1 controls, and the bidirectional embeddings, overrides and
    /// isolates (a line that displays in another order than it reads).
    static func isUnsafe(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x0A, 0x09: false
        case 0x00...0x1F, 0x7F...0x9F: true
        case 0x202A...0x202E, 0x2066...0x2069, 0x200E, 0x200F, 0x061C: true
        default: false
        }
    }
}

/// The executable's `print`: `Swift.print` with ``TerminalText/escaped(_:)`` applied, so no print in this
/// module can pass a control character from the database to the terminal.
func print(_ items: Any..., separator: String = " ", terminator: String = "\n") {
    Swift.print(TerminalText.escaped(items.map { "\($0)" }.joined(separator: separator)), terminator: terminator)
}
