//! The status view as aligned text for a terminal (pure).

use super::{Claim, LinstorClaim, Repair, StatusView};

/// The view as aligned text for a terminal.
pub fn table(view: &StatusView) -> String {
    let mut out = String::new();
    let leader = &view.leader;
    let lead = match (&leader.holder, leader.renewed_seconds_ago) {
        (Some(holder), Some(age)) if leader.fresh => format!("held by {holder}, renewed {age}s ago"),
        (Some(holder), Some(age)) => format!("STALE: held by {holder}, last renewed {age}s ago"),
        _ => "NONE: no replica leads".to_owned(),
    };
    out.push_str(&format!("Leader ({}/{}): {lead}\n\n", view.namespace, leader.lease));
    let ago = |s: Option<i64>| s.map_or("-".to_owned(), |s| format!("{s}s ago"));
    let dash = |list: &[String]| {
        if list.is_empty() {
            "-".to_owned()
        } else {
            list.join(",")
        }
    };
    let agents: Vec<Vec<String>> = view
        .agents
        .iter()
        .map(|a| {
            vec![
                a.node.clone(),
                a.pod.clone(),
                yes(a.ready).to_owned(),
                ago(a.heartbeat_seconds_ago),
                ago(a.drbd_reported_seconds_ago),
                a.primaries.to_string(),
                dash(&a.taints),
            ]
        })
        .collect();
    out.push_str(&format!("Agents ({})\n", view.agents.len()));
    out.push_str(&columns(
        &[
            "NODE",
            "POD",
            "READY",
            "HEARTBEAT",
            "DRBD REPORTED",
            "PRIMARIES",
            "TAINTS",
        ],
        &agents,
    ));
    out.push_str(&repair_table(&view.repairs));
    let reserved: Vec<String> = view
        .reservations
        .iter()
        .map(|r| format!("{} (expires in {}s)", r.node, r.expires_in_seconds))
        .collect();
    out.push_str(&format!("\nFail-over guard reservations: {}\n\n", dash(&reserved)));
    out.push_str(&claims_table(&view.claims));
    out.push_str(&linstor_table(&view.served_by_linstor));
    out
}

fn claims_table(claims: &[Claim]) -> String {
    let rows: Vec<Vec<String>> = claims
        .iter()
        .map(|c| {
            let moved = c.last_move.as_ref().map_or("-".to_owned(), |m| {
                format!(
                    "to {} at {}",
                    m.node.as_deref().unwrap_or("?"),
                    m.at.as_deref().unwrap_or("?")
                )
            });
            vec![
                format!("{}/{}", c.namespace, c.name),
                c.ready.clone(),
                c.reason.clone(),
                c.mount_endpoint.clone().unwrap_or_else(|| "-".into()),
                c.primary_node.clone().unwrap_or_else(|| "-".into()),
                moved,
            ]
        })
        .collect();
    let header = format!("Claims ({})\n", claims.len());
    header
        + &columns(
            &["CLAIM", "READY", "REASON", "MOUNT ENDPOINT", "PRIMARY", "LAST MOVE"],
            &rows,
        )
}

fn linstor_table(claims: &[LinstorClaim]) -> String {
    let rows: Vec<Vec<String>> = claims
        .iter()
        .map(|c| {
            let dash = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".into());
            vec![
                format!("{}/{}", c.namespace, c.name),
                c.export.clone(),
                c.server.clone().unwrap_or_else(|| "NONE ADVERTISED".into()),
                dash(&c.since),
                dash(&c.primary_node),
            ]
        })
        .collect();
    let header = format!("\nServed by LINSTOR CSI ({})\n", claims.len());
    header + &columns(&["CLAIM", "EXPORT", "SERVER", "SINCE", "PRIMARY"], &rows)
}

fn repair_table(repairs: &[Repair]) -> String {
    let rows: Vec<Vec<String>> = repairs
        .iter()
        .map(|r| {
            let why = r.not_running.clone().unwrap_or_else(|| "-".into());
            vec![r.node.clone(), r.pod.clone(), yes(r.ready).to_owned(), why]
        })
        .collect();
    let header = format!("\nConntrack repair ({})\n", repairs.len());
    header + &columns(&["NODE", "POD", "READY", "NOT RUNNING"], &rows)
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}

/// Rows under a header, each column as wide as its widest cell, indented by two.
fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        format!("  {}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}
