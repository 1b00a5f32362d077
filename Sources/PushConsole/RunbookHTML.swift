import Foundation

/// The runbook's Markdown as the little HTML the console needs: paragraphs, fenced code, `code` spans, and
/// links shown as their text (they point into docs/runbook.md and docs/operations.md). Everything is escaped first.
enum RunbookHTML {
    static func render(_ markdown: String) -> String {
        var html = ""
        var paragraph: [String] = []
        var code: [String]?
        func flush() {
            if !paragraph.isEmpty { html += "<p>" + inline(paragraph.joined(separator: " ")) + "</p>" }
            paragraph = []
        }
        for line in markdown.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
            if line.hasPrefix("```") {
                if let lines = code {
                    html += "<pre>" + escape(lines.joined(separator: "\n")) + "</pre>"
                    code = nil
                } else {
                    flush()
                    code = []
                }
            } else if code != nil {
                code?.append(line)
            } else if line.trimmingCharacters(in: .whitespaces).isEmpty {
                flush()
            } else {
                paragraph.append(line)
            }
        }
        flush()
        return html
    }

    static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.count)
        for c in text {
            switch c {
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "&": out += "&amp;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.append(c)
            }
        }
        return out
    }

    /// `code` spans and [text](link) → text, on escaped text.
    private static func inline(_ text: String) -> String {
        var out = ""
        var rest = Substring(text)
        while let tick = rest.firstIndex(of: "`") {
            out += links(escape(String(rest[..<tick])))
            let after = rest[rest.index(after: tick)...]
            guard let close = after.firstIndex(of: "`") else {
                out += escape(String(rest[tick...]))
                return out
            }
            out += "<code>" + escape(String(after[..<close])) + "</code>"
            rest = after[after.index(after: close)...]
        }
        return out + links(escape(String(rest)))
    }

    private static func links(_ text: String) -> String {
        text.replacingOccurrences(of: #"\[([^\]]+)\]\([^)]*\)"#, with: "$1", options: .regularExpression)
    }
}
