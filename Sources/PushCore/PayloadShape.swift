/// A strict JSON (RFC 8259) scanner over bytes for the one question every send asks of its payload: is it a
/// JSON object whose `aps` member is an object, and which keys does that object have? It builds no values,
/// so the common payload is judged without Foundation's object graph.
///
/// It expects valid UTF-8 (its caller passes the bytes of a Swift `String`) and answers only when it is sure
/// to agree with `JSONSerialization`: anything unusual (escaped or non-ASCII keys,
/// numbers with exponents or many digits, surrogate escapes, deep nesting, a repeated `aps`) gives `nil`,
/// and the caller takes the full parse.
enum PayloadShape {
    struct Summary {
        /// The top-level object's `aps` member is an object.
        var apsIsObject = false
        /// The raw bytes of that object's keys (none of them contained an escape).
        var apsKeys: [ArraySlice<UInt8>] = []
        /// Whether `aps.sound` is an object (a critical alert's sound dictionary).
        var soundIsObject = false
    }

    static func scan(_ bytes: [UInt8]) -> Summary? {
        var scanner = Scanner(bytes: bytes)
        scanner.skipWhitespace()
        guard scanner.peek == UInt8(ascii: "{") else { return nil }
        var summary = Summary()
        var sawAPS = false
        guard
            scanner.object(
                depth: 1,
                onMember: { key, scanner in
                    guard key.elementsEqual("aps".utf8) else { return scanner.value(depth: 2) }
                    guard !sawAPS else { return false }
                    sawAPS = true
                    if scanner.peek == UInt8(ascii: "{") {
                        summary.apsIsObject = true
                        return scanner.object(depth: 2) { key, scanner in
                            summary.apsKeys.append(key)
                            if key.elementsEqual("sound".utf8), scanner.peek == UInt8(ascii: "{") {
                                summary.soundIsObject = true
                            }
                            return scanner.value(depth: 3)
                        }
                    }
                    return scanner.value(depth: 2)
                }
            )
        else { return nil }
        scanner.skipWhitespace()
        guard scanner.atEnd else { return nil }
        return summary
    }

    struct Scanner {
        let bytes: [UInt8]
        var index = 0
        static let maxDepth = 64

        var atEnd: Bool { self.index >= self.bytes.count }
        var peek: UInt8? { self.atEnd ? nil : self.bytes[self.index] }

        mutating func skipWhitespace() {
            while let byte = self.peek,
                byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") || byte == UInt8(ascii: "\n")
                    || byte == UInt8(ascii: "\r")
            {
                self.index += 1
            }
        }

        /// `open element (, element)* close` or `open close`, the cursor on `open`.
        mutating func delimited(closer: UInt8, _ element: (inout Scanner) -> Bool) -> Bool {
            self.index += 1
            self.skipWhitespace()
            if self.peek == closer {
                self.index += 1
                return true
            }
            while true {
                self.skipWhitespace()
                guard element(&self) else { return false }
                self.skipWhitespace()
                switch self.peek {
                case UInt8(ascii: ","): self.index += 1
                case closer:
                    self.index += 1
                    return true
                default: return false
                }
            }
        }

        /// An object at the cursor; `onMember` gets each key with the cursor at its value and must consume
        /// the value. With `plainKeys` (the levels that matter) only keys of plain ASCII without escapes are
        /// taken: the full parse decodes keys through String, which drops a leading byte-order mark
        /// (`\u{FEFF}aps` is `aps` to it), and compares them by canonical equivalence. False: invalid, or
        /// not sure.
        mutating func object(
            depth: Int,
            plainKeys: Bool = true,
            onMember: (ArraySlice<UInt8>, inout Scanner) -> Bool
        ) -> Bool {
            guard depth <= Self.maxDepth, self.peek == UInt8(ascii: "{") else { return false }
            return self.delimited(closer: UInt8(ascii: "}")) { scanner in
                guard let (key, escaped) = scanner.string() else { return false }
                if plainKeys && (escaped || !key.allSatisfy({ $0 < 0x80 })) { return false }
                scanner.skipWhitespace()
                guard scanner.peek == UInt8(ascii: ":") else { return false }
                scanner.index += 1
                scanner.skipWhitespace()
                return onMember(key, &scanner)
            }
        }

        mutating func value(depth: Int) -> Bool {
            guard depth <= Self.maxDepth, let byte = self.peek else { return false }
            switch byte {
            case UInt8(ascii: "{"):
                // Keys with escapes are fine below the levels that matter.
                return self.object(depth: depth, plainKeys: false) { _, scanner in scanner.value(depth: depth + 1) }
            case UInt8(ascii: "["): return self.delimited(closer: UInt8(ascii: "]")) { $0.value(depth: depth + 1) }
            case UInt8(ascii: "\""): return self.string() != nil
            case UInt8(ascii: "t"): return self.literal("true")
            case UInt8(ascii: "f"): return self.literal("false")
            case UInt8(ascii: "n"): return self.literal("null")
            default: return self.number()
            }
        }

        /// A string at the cursor: its raw content bytes and whether it held an escape; `nil` if invalid
        /// (or a surrogate escape, which the scanner leaves to the full parse).
        mutating func string() -> (ArraySlice<UInt8>, Bool)? {
            guard self.peek == UInt8(ascii: "\"") else { return nil }
            self.index += 1
            let start = self.index
            var escaped = false
            while let byte = self.peek {
                switch byte {
                case UInt8(ascii: "\""):
                    let content = self.bytes[start..<self.index]
                    self.index += 1
                    return (content, escaped)
                case UInt8(ascii: "\\"):
                    escaped = true
                    self.index += 1
                    guard let next = self.peek else { return nil }
                    switch next {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                        UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                        self.index += 1
                    case UInt8(ascii: "u"):
                        guard self.index + 4 < self.bytes.count else { return nil }
                        var code = 0
                        for digit in self.bytes[(self.index + 1)...(self.index + 4)] {
                            guard let value = Self.hexValue(digit) else { return nil }
                            code = code * 16 + value
                        }
                        if (0xD800...0xDFFF).contains(code) { return nil }
                        self.index += 5
                    default: return nil
                    }
                case 0..<0x20: return nil
                default: self.index += 1
                }
            }
            return nil
        }

        static func hexValue(_ byte: UInt8) -> Int? {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return Int(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return Int(byte - UInt8(ascii: "a")) + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): return Int(byte - UInt8(ascii: "A")) + 10
            default: return nil
            }
        }

        mutating func literal(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard self.index + count <= self.bytes.count else { return false }
            let matches = word.withUTF8Buffer { self.bytes[self.index..<(self.index + count)].elementsEqual($0) }
            if matches { self.index += count }
            return matches
        }

        /// `-? (0 | [1-9][0-9]*) (. [0-9]+)?`, at most 15 digits; an exponent is left to the full parse.
        mutating func number() -> Bool {
            var digits = 0
            if self.peek == UInt8(ascii: "-") { self.index += 1 }
            guard let first = self.peek, Self.isDigit(first) else { return false }
            self.index += 1
            digits += 1
            if first != UInt8(ascii: "0") {
                while let byte = self.peek, Self.isDigit(byte) {
                    self.index += 1
                    digits += 1
                }
            }
            if self.peek == UInt8(ascii: ".") {
                self.index += 1
                guard let byte = self.peek, Self.isDigit(byte) else { return false }
                while let byte = self.peek, Self.isDigit(byte) {
                    self.index += 1
                    digits += 1
                }
            }
            if self.peek == UInt8(ascii: "e") || self.peek == UInt8(ascii: "E") { return false }
            return digits <= 15
        }

        static func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }
    }
}
