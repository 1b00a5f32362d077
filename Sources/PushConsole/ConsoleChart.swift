import Foundation
import PushQueue

/// The last hour as an inline SVG bar chart, drawn on the server: deliveries per minute above the axis,
/// dead letters per minute below it, each on its own scale (labelled). Presentation attributes only, no
/// `style`, so the page's Content-Security-Policy needs no inline-style exception.
enum ConsoleChart {
    static func svg(_ minutes: [MinuteOutcomes]) -> String {
        let width = 900.0
        let up = 130.0
        let down = 60.0
        let left = 56.0
        let top = 14.0
        let axis = top + up
        let height = axis + down + 26
        let slot = (width - left - 10) / Double(max(minutes.count, 1))
        let maxDelivered = max(minutes.map(\.delivered).max() ?? 0, 1)
        let maxDead = max(minutes.map(\.dead).max() ?? 0, 1)
        var svg = """
            <svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 \(Int(width)) \(Int(height))" role="img" \
            aria-label="Deliveries and dead letters per minute over the last hour">
            <line x1="\(left)" y1="\(axis)" x2="\(width - 10)" y2="\(axis)" stroke="#8c959f" stroke-width="1"/>
            <text x="\(left - 6)" y="\(top + 10)" text-anchor="end" font-size="11" fill="#1a7f37">\(grouped(maxDelivered))/min</text>
            <text x="\(left - 6)" y="\(axis + down)" text-anchor="end" font-size="11" fill="#cf222e">\(grouped(maxDead))/min</text>
            <text x="\(left)" y="\(height - 6)" font-size="11" fill="#5f6b76">60 min ago</text>
            <text x="\(width - 10)" y="\(height - 6)" text-anchor="end" font-size="11" fill="#5f6b76">now</text>

            """
        for (n, minute) in minutes.enumerated() {
            let x = left + Double(n) * slot + 1
            let w = max(slot - 2, 1)
            let time = minute.minute.formatted(.iso8601.time(includingFractionalSeconds: false))
            if minute.delivered > 0 {
                let h = max(up * Double(minute.delivered) / Double(maxDelivered), 1)
                svg += """
                    <rect x="\(fixed(x))" y="\(fixed(axis - h))" width="\(fixed(w))" height="\(fixed(h))" fill="#2da44e">\
                    <title>\(time) UTC: \(grouped(minute.delivered)) delivered</title></rect>

                    """
            }
            if minute.dead > 0 {
                let h = max(down * Double(minute.dead) / Double(maxDead), 1)
                svg += """
                    <rect x="\(fixed(x))" y="\(fixed(axis))" width="\(fixed(w))" height="\(fixed(h))" fill="#cf222e">\
                    <title>\(time) UTC: \(grouped(minute.dead)) dead-lettered</title></rect>

                    """
            }
        }
        return svg + "</svg>"
    }

    private static func fixed(_ value: Double) -> String { String(format: "%.1f", value) }
}

/// 1,234,567.
func grouped(_ value: Int) -> String {
    value.formatted(.number.grouping(.automatic).locale(Locale(identifier: "en_US")))
}
