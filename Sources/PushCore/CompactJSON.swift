/// JSON text without the whitespace between tokens, byte for byte otherwise: what Postgres' `jsonb`
/// output (a space after every `:` and `,`) becomes on the wire, so the size limit judges what is sent.
/// Strings, escapes and numbers are copied untouched; only space, tab, CR and LF outside strings go.
public enum CompactJSON {
    /// `text` with insignificant whitespace removed. Valid JSON stays valid and means the same.
    public static func bytes(_ text: String) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count)
        var inString = false
        var escaped = false
        for byte in text.utf8 {
            if inString {
                out.append(byte)
                if escaped {
                    escaped = false
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                }
                continue
            }
            switch byte {
            case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"): continue
            case UInt8(ascii: "\""):
                inString = true
                out.append(byte)
            default: out.append(byte)
            }
        }
        return out
    }
}
