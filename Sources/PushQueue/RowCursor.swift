import PostgresNIO

/// Reads a row's columns in order, by position: no per-row name table, no hashing of column names (on the
/// claim's hot path that was a tenth of the worker's Postgres decoding). A statement read with it lists its
/// columns in exactly the order its reader takes them.
struct RowCursor {
    private var cells: PostgresRow.Iterator
    private var lookahead: PostgresCell?

    init(_ row: PostgresRow) {
        self.cells = row.makeIterator()
    }

    /// The next column, decoded; a missing column is a programming error (the statement and its reader
    /// disagree), reported as a decoding failure rather than a crash.
    mutating func next<T: PostgresDecodable>(_ type: T.Type = T.self) throws -> T {
        guard let cell = self.lookahead.take() ?? self.cells.next() else { throw RowCursorError.tooFewColumns }
        return try cell.decode(T.self)
    }

    /// Whether the next column is NULL, without taking it.
    mutating func nextIsNull() -> Bool {
        if self.lookahead == nil { self.lookahead = self.cells.next() }
        return self.lookahead?.bytes == nil
    }
}

/// A statement returned fewer columns than its reader takes.
struct RowCursorError: Error, CustomStringConvertible {
    static let tooFewColumns = RowCursorError()
    var description: String { "the row has fewer columns than its reader expects" }
}
