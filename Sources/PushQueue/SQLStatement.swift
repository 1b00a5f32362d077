import Foundation
import PostgresNIO

/// A statement kept in a `.sql` file under `Statements/`, embedded in the binary like the migrations: a file
/// of its own (the claim, the outcome write), or one of the named statements of its table's file (River's
/// way: `jobs.sql`, `dead_jobs.sql`, `controls.sql`, `workers.sql`, `webhooks.sql`), where a line
/// `-- name: x` starts statement `x` and the next such line ends it. In the text, `{{name}}` includes the
/// fragment `name.sql` of the same folder, and `:name` is a named bind. The Swift side declares the binds
/// once, in order (``binds``): that list is the one place a name maps to its `$n`, and ``NamedBindings``
/// refuses a value bound under another name than its position's.
struct SQLStatement: Sendable {
    /// The file's name without `.sql`, and the statement's name in it (`nil`: the whole file).
    let file: String
    let name: String?
    /// The statement as Postgres gets it: fragments included, binds numbered.
    let sql: String
    /// The binds in `$1…$n` order.
    let binds: [String]

    /// Renders `file` with its binds numbered in the order of `binds`. A bind used in the file but not
    /// declared, or declared but not used, or an include with no file, stops the process: a mistake in a
    /// statement's source, caught the first time a test touches it (`SQLStatementTests` renders them all).
    init(file: String, name: String? = nil, binds: [String] = []) {
        self.file = file
        self.name = name
        self.binds = binds
        let location = Self.location(file, name)
        let text = Self.include(Self.text(of: file, statement: name), from: file)
        var used = Set<String>()
        var rendered = ""
        rendered.reserveCapacity(text.utf8.count)
        var scalars = text.unicodeScalars[...]
        var previous: Unicode.Scalar = " "
        while let scalar = scalars.first {
            scalars.removeFirst()
            // A comment (to the end of its line) and a string literal are copied as they are: no bind there.
            if scalar == "-" && scalars.first == "-" {
                let comment = scalars.prefix(while: { $0 != "\n" })
                rendered.unicodeScalars.append(scalar)
                rendered.unicodeScalars.append(contentsOf: comment)
                scalars.removeFirst(comment.count)
                previous = " "
                continue
            }
            if scalar == "'" {
                let literal = scalars.prefix(while: { $0 != "'" })
                rendered.unicodeScalars.append(scalar)
                rendered.unicodeScalars.append(contentsOf: literal)
                scalars.removeFirst(literal.count)
                if let close = scalars.first {
                    rendered.unicodeScalars.append(close)
                    scalars.removeFirst()
                }
                previous = "'"
                continue
            }
            if scalar == ":" && previous != ":" && !Self.isWord(previous), let first = scalars.first,
                Self.isLower(first)
            {
                let name = String(String.UnicodeScalarView(scalars.prefix(while: Self.isWord)))
                scalars.removeFirst(name.unicodeScalars.count)
                guard let index = binds.firstIndex(of: name) else {
                    fatalError("\(location) binds :\(name), which its Swift side does not declare")
                }
                used.insert(name)
                rendered += "$\(index + 1)"
                previous = "0"
                continue
            }
            rendered.unicodeScalars.append(scalar)
            previous = scalar
        }
        if let unused = binds.first(where: { !used.contains($0) }) {
            fatalError("\(location) does not use the declared bind :\(unused)")
        }
        self.sql = rendered.trimmingTrailingNewlines()
    }

    /// A fragment's text with its own includes resolved (for SQL that Swift still assembles).
    static func fragment(_ file: String) -> String {
        Self.include(Self.text(of: file), from: file).trimmingTrailingNewlines()
    }

    /// Where it is kept, for messages: `Statements/jobs.sql, statement extend_leases`.
    var location: String { Self.location(self.file, self.name) }

    static func location(_ file: String, _ name: String?) -> String {
        "Statements/\(file).sql" + (name.map { ", statement \($0)" } ?? "")
    }

    /// The query to send: this statement with `bind` giving each declared bind its value, in order.
    func query(_ bind: (inout NamedBindings) -> Void = { _ in }) -> PostgresQuery {
        var binds = NamedBindings(for: self)
        bind(&binds)
        return PostgresQuery(unsafeSQL: self.sql, binds: binds.complete)
    }

    /// The query to send for a statement that names an object where no bind can stand (`DROP INDEX`): its one
    /// `%I` replaced by `identifier` quoted, as Postgres' `format('%I')` would. `identifier` is a name this
    /// process made (`schema.name` or `name`); anything else stops the process.
    func query(identifier: String) -> PostgresQuery {
        let parts = identifier.split(separator: ".", omittingEmptySubsequences: false)
        precondition(
            self.binds.isEmpty && (1...2).contains(parts.count)
                && parts.allSatisfy { !$0.isEmpty && $0.unicodeScalars.allSatisfy(Self.isWord) },
            "\(self.location): \(identifier) is not a plain identifier"
        )
        let quoted = parts.map { "\"\($0)\"" }.joined(separator: ".")
        precondition(self.sql.components(separatedBy: "%I").count == 2, "\(self.location): needs exactly one %I")
        return PostgresQuery(unsafeSQL: self.sql.replacingOccurrences(of: "%I", with: quoted))
    }

    /// A file's text, or its named statement's, without leading and trailing comment lines (the description,
    /// for people: not sent to Postgres with every call, and never in the middle of an including line).
    static func text(of file: String, statement: String? = nil) -> String {
        guard let bytes = Self.files[file] else { fatalError("no statement file Statements/\(file).sql") }
        var lines = String(decoding: bytes, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)[...]
        if let statement {
            let marker = "-- name: \(statement)"
            guard let start = lines.firstIndex(where: { $0.trimmingCharacters(in: .whitespaces) == marker }) else {
                fatalError("Statements/\(file).sql has no statement \(statement) (a line `\(marker)`)")
            }
            let rest = lines[(start + 1)...]
            lines = rest[..<(rest.firstIndex(where: { $0.hasPrefix("-- name: ") }) ?? rest.endIndex)]
        }
        func isCommentOrBlank(_ line: Substring) -> Bool {
            let trimmed = line.drop(while: { $0 == " " })
            return trimmed.isEmpty || trimmed.hasPrefix("--")
        }
        // Leading and trailing comments go: included mid-line, a trailing one would comment out the rest.
        while let first = lines.first, isCommentOrBlank(first) { lines.removeFirst() }
        while let last = lines.last, isCommentOrBlank(last) { lines.removeLast() }
        return lines.joined(separator: "\n")
    }

    /// Replaces each `{{name}}` with the fragment `name.sql`.
    static func include(_ text: String, from file: String, depth: Int = 0) -> String {
        precondition(depth < 8, "Statements/\(file).sql includes itself")
        var result = ""
        var rest = text[...]
        while let open = rest.range(of: "{{") {
            result += rest[..<open.lowerBound]
            guard let close = rest[open.upperBound...].range(of: "}}") else {
                fatalError("Statements/\(file).sql has an unclosed {{")
            }
            let name = String(rest[open.upperBound..<close.lowerBound])
            result += Self.include(Self.text(of: name), from: name, depth: depth + 1).trimmingTrailingNewlines()
            rest = rest[close.upperBound...]
        }
        return result + rest
    }

    static func isLower(_ scalar: Unicode.Scalar) -> Bool { ("a"..."z").contains(scalar) }
    static func isWord(_ scalar: Unicode.Scalar) -> Bool {
        Self.isLower(scalar) || ("A"..."Z").contains(scalar) || ("0"..."9").contains(scalar) || scalar == "_"
    }

    /// The files of `Statements/`, by name.
    static let files: [String: [UInt8]] = [
        "claim": PackageResources.claim_sql,
        "write_outcomes": PackageResources.write_outcomes_sql,
        "pending_credentials": PackageResources.pending_credentials_sql,
        "job_columns": PackageResources.job_columns_sql,
        "outcome_input_rows": PackageResources.outcome_input_rows_sql,
        "dead_letter_columns": PackageResources.dead_letter_columns_sql,
        "dead_conflict": PackageResources.dead_conflict_sql,
        "webhook_delivery_body": PackageResources.webhook_delivery_body_sql,
        "back_to_pending": PackageResources.back_to_pending_sql,
        "workers": PackageResources.workers_sql,
        "controls": PackageResources.controls_sql,
        "available_now": PackageResources.available_now_sql,
        "jobs": PackageResources.jobs_sql,
        "webhooks": PackageResources.webhooks_sql,
        "dead_jobs": PackageResources.dead_jobs_sql,
        "migrations": PackageResources.migrations_sql,
        "provider_tokens": PackageResources.provider_tokens_sql,
        "token_replaceable": PackageResources.token_replaceable_sql,
        "earliest_pending_run_at": PackageResources.earliest_pending_run_at_sql,
        "shown_history": PackageResources.shown_history_sql,
        "session": PackageResources.session_sql,
        "devices": PackageResources.devices_sql,
        "activities": PackageResources.activities_sql,
        "dead_letter_filter": PackageResources.dead_letter_filter_sql,
        "dead_letter_replay_candidate": PackageResources.dead_letter_replay_candidate_sql,
        "dead_letter_replay_rank": PackageResources.dead_letter_replay_rank_sql,
    ]

    /// Every named statement of a table's file, for the test that renders them all.
    static func names(in file: String) -> [String] {
        guard let bytes = Self.files[file] else { return [] }
        return String(decoding: bytes, as: UTF8.self).split(separator: "\n").compactMap { line in
            line.hasPrefix("-- name: ")
                ? String(line.dropFirst("-- name: ".count)).trimmingCharacters(in: .whitespaces) : nil
        }
    }
}

/// The Swift side of one table's file of named statements (`JobsSQL` for `Statements/jobs.sql`, …): each
/// statement declared once, with its binds in order, through ``named(_:_:)``.
protocol StatementFile {
    /// The file's name under `Statements/`, without `.sql`.
    static var file: String { get }
}

extension StatementFile {
    /// Statement `name` of this file, with its binds in order.
    static func named(_ name: String, _ binds: String...) -> SQLStatement {
        SQLStatement(file: Self.file, name: name, binds: binds)
    }
}

/// A statement's bindings, appended by name in the statement's declared order.
struct NamedBindings {
    let statement: SQLStatement
    private(set) var bindings: PostgresBindings
    private var next = 0

    init(for statement: SQLStatement) {
        self.statement = statement
        self.bindings = PostgresBindings(capacity: statement.binds.count)
    }

    /// Binds `value` as `:name`, which must be the statement's next bind.
    mutating func bind(_ name: String, _ value: some PostgresDynamicTypeEncodable) {
        self.expect(name)
        self.bindings.append(value)
    }

    /// Binds `value` as `:name` (`nil`: NULL, its type left to Postgres).
    mutating func bind<Value: PostgresDynamicTypeEncodable>(_ name: String, _ value: Value?) {
        self.expect(name)
        self.bindings.append(value)
    }

    private mutating func expect(_ name: String) {
        precondition(
            self.next < self.statement.binds.count && self.statement.binds[self.next] == name,
            "\(self.statement.location): :\(name) bound where :\(self.next < self.statement.binds.count ? self.statement.binds[self.next] : "nothing") belongs"
        )
        self.next += 1
    }

    /// The bindings, once every declared bind has its value.
    var complete: PostgresBindings {
        precondition(self.next == self.statement.binds.count, "\(self.statement.location): binds missing")
        return self.bindings
    }
}

extension String {
    fileprivate func trimmingTrailingNewlines() -> String {
        var text = self[...]
        while text.last == "\n" { text.removeLast() }
        return String(text)
    }
}
