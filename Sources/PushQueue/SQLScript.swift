/// Splits a SQL script into single statements, so each can be sent over the extended query protocol.
///
/// Understands what psql does for the files in `sql/`: `--` and `/* */` comments, single-quoted strings,
/// double-quoted identifiers and dollar-quoted bodies (`$$ … $$`, `$tag$ … $tag$`). Comments are dropped.
enum SQLScript {
    static func statements(in script: String) -> [String] {
        let chars = Array(script.unicodeScalars)
        var statements: [String] = []
        var current = String.UnicodeScalarView()
        var i = 0

        func flush() {
            let text = String(current).trimmingWhitespace()
            if !text.isEmpty { statements.append(text) }
            current = String.UnicodeScalarView()
        }

        while i < chars.count {
            let c = chars[i]
            let next: Unicode.Scalar? = i + 1 < chars.count ? chars[i + 1] : nil
            if c == "-" && next == "-" {
                while i < chars.count && chars[i] != "\n" { i += 1 }
                continue
            }
            if c == "/" && next == "*" {
                i += 2
                while i + 1 < chars.count && !(chars[i] == "*" && chars[i + 1] == "/") { i += 1 }
                i += 2
                continue
            }
            if c == "'" || c == "\"" {
                current.append(c)
                i += 1
                while i < chars.count {
                    current.append(chars[i])
                    if chars[i] == c {
                        if i + 1 < chars.count && chars[i + 1] == c {
                            current.append(chars[i + 1])
                            i += 2
                            continue
                        }
                        i += 1
                        break
                    }
                    i += 1
                }
                continue
            }
            if c == "$", let tag = dollarTag(chars, at: i) {
                current.append(contentsOf: tag)
                i += tag.count
                while i < chars.count {
                    if chars[i] == "$", Array(chars[i..<min(i + tag.count, chars.count)]) == tag {
                        current.append(contentsOf: tag)
                        i += tag.count
                        break
                    }
                    current.append(chars[i])
                    i += 1
                }
                continue
            }
            if c == ";" {
                flush()
                i += 1
                continue
            }
            current.append(c)
            i += 1
        }
        flush()
        return statements
    }

    /// The dollar-quote opening at `start` (`$$` or `$tag$`), if there is one.
    private static func dollarTag(_ chars: [Unicode.Scalar], at start: Int) -> [Unicode.Scalar]? {
        var j = start + 1
        while j < chars.count {
            let c = chars[j]
            if c == "$" { return Array(chars[start...j]) }
            let isTagChar = c == "_" || c.properties.isAlphabetic || (j > start + 1 && ("0"..."9").contains(c))
            if !isTagChar { return nil }
            j += 1
        }
        return nil
    }
}

extension String {
    func trimmingWhitespace() -> String {
        var scalars = Substring(self)
        while let first = scalars.first, first.isWhitespace { scalars.removeFirst() }
        while let last = scalars.last, last.isWhitespace { scalars.removeLast() }
        return String(scalars)
    }
}
