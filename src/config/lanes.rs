//! `delivery.priority_lanes`: named lanes that map normalized priority values, in the order
//! a fetched batch is handed to the sink.
//!
//! Lanes act inside one fetched batch only: its messages go to the sink lane by lane, the
//! first lane first, one `write_batch` call per lane that has messages. They do not reorder
//! across batches, sink workers or runners, and they do not make the broker deliver urgent
//! messages sooner.

use crate::document::grammar::is_family_label;
use crate::document::reader::ObjectReader;

/// At most this many lanes: each is one more sink call per batch.
pub const MAX_LANES: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    /// A reviewed label (`[a-z][a-z0-9_-]*`): it names the lane's counters.
    pub name: String,
    /// Normalized priority values that belong to this lane.
    pub priorities: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityLanes {
    /// In hand-off order.
    pub lanes: Vec<Lane>,
    /// Index into `lanes` of the lane for a priority no lane lists.
    pub default_lane: usize,
}

impl PriorityLanes {
    /// Reads the block; problems are reported on the reader with their field paths.
    pub fn read(r: &mut ObjectReader<'_>) -> Option<PriorityLanes> {
        let mut lanes: Vec<Lane> = Vec::new();
        let readers = r.objects("lanes");
        if readers.is_empty() {
            r.problem("lanes", "must list at least one lane");
        }
        if readers.len() > MAX_LANES {
            r.problem("lanes", format!("must list at most {MAX_LANES} lanes"));
        }
        for mut l in readers {
            let name = l.req_string("name");
            if !name.is_empty() && !is_family_label(&name) {
                l.problem(
                    "name",
                    "must be a lowercase label ([a-z][a-z0-9_-]*, at most 64 bytes)",
                );
            }
            if lanes.iter().any(|o| o.name == name) {
                l.problem(
                    "name",
                    format!("repeats the name of an earlier lane \"{name}\""),
                );
            }
            let priorities = l.string_list("priorities");
            if priorities.is_empty() {
                l.problem("priorities", "must list at least one priority value");
            }
            for (j, p) in priorities.iter().enumerate() {
                let path = format!("{}[{j}]", l.path_of("priorities"));
                if p.is_empty() {
                    l.problems().push(path, "must not be empty");
                } else if let Some(other) = lanes.iter().position(|o| o.priorities.contains(p)) {
                    l.problems().push(
                        path,
                        format!("\"{p}\" is already in lane {other} ({})", lanes[other].name),
                    );
                } else if priorities[..j].contains(p) {
                    l.problems().push(path, format!("\"{p}\" is listed twice"));
                }
            }
            l.finish();
            lanes.push(Lane { name, priorities });
        }
        let default_lane = match r.opt_string("default_lane") {
            None => lanes.len().saturating_sub(1),
            Some(d) => match lanes.iter().position(|l| l.name == d) {
                Some(i) => i,
                None => {
                    r.problem("default_lane", format!("\"{d}\" names no lane in lanes"));
                    0
                }
            },
        };
        if lanes.is_empty() {
            return None;
        }
        Some(PriorityLanes {
            lanes,
            default_lane,
        })
    }

    /// The lane of a normalized priority value.
    pub fn lane_of(&self, priority: &str) -> usize {
        self.lanes
            .iter()
            .position(|l| l.priorities.iter().any(|p| p == priority))
            .unwrap_or(self.default_lane)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::reader::Problems;
    use serde_json::json;

    fn read(v: serde_json::Value) -> (Option<PriorityLanes>, Vec<String>) {
        let problems = Problems::new();
        let mut r = ObjectReader::at("delivery.priority_lanes".into(), &v, &problems);
        let lanes = PriorityLanes::read(&mut r);
        r.finish();
        let texts = problems
            .into_vec()
            .into_iter()
            .map(|p| p.to_string())
            .collect();
        (lanes, texts)
    }

    #[test]
    fn priorities_map_to_lanes_and_the_rest_to_the_default() {
        let (lanes, problems) = read(json!({
            "lanes": [
                {"name": "flash", "priorities": ["flash"]},
                {"name": "priority", "priorities": ["priority", "high"]},
                {"name": "routine", "priorities": ["routine"]}
            ]
        }));
        assert!(problems.is_empty(), "{problems:?}");
        let lanes = lanes.unwrap();
        assert_eq!(lanes.lane_of("flash"), 0);
        assert_eq!(lanes.lane_of("high"), 1);
        assert_eq!(lanes.lane_of("routine"), 2);
        // No default named: the last lane takes what no lane lists.
        assert_eq!(lanes.lane_of("unheard-of"), 2);
    }

    #[test]
    fn a_named_default_lane_takes_unknown_priorities() {
        let (lanes, problems) = read(json!({
            "lanes": [{"name": "flash", "priorities": ["flash"]},
                      {"name": "routine", "priorities": ["routine"]}],
            "default_lane": "flash"
        }));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(lanes.unwrap().lane_of("normal"), 0);
    }

    #[test]
    fn every_bad_field_is_named() {
        let (_, problems) = read(json!({
            "lanes": [
                {"name": "Flash!", "priorities": ["flash", "flash"]},
                {"name": "b", "priorities": []},
                {"name": "b", "priorities": ["flash", ""], "colour": "red"}
            ],
            "default_lane": "nowhere"
        }));
        let all = problems.join("\n");
        for expected in [
            "delivery.priority_lanes.lanes[0].name: must be a lowercase label",
            "delivery.priority_lanes.lanes[0].priorities[1]: \"flash\" is listed twice",
            "delivery.priority_lanes.lanes[1].priorities: must list at least one priority value",
            "delivery.priority_lanes.lanes[2].name: repeats the name of an earlier lane \"b\"",
            "delivery.priority_lanes.lanes[2].priorities[0]: \"flash\" is already in lane 0",
            "delivery.priority_lanes.lanes[2].priorities[1]: must not be empty",
            "delivery.priority_lanes.lanes[2].colour",
            "delivery.priority_lanes.default_lane: \"nowhere\" names no lane in lanes",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
    }

    #[test]
    fn no_lane_is_a_problem() {
        let (lanes, problems) = read(json!({"lanes": []}));
        assert!(lanes.is_none());
        assert_eq!(
            problems,
            ["delivery.priority_lanes.lanes: must list at least one lane"]
        );
    }
}
