//! A small YAML node tree with 1-based line/column marks, built from yaml-rust2's event parser.
//! Owns YAML-level checks only (syntax, one document, no aliases, no duplicate keys, nesting
//! depth, scalar typing); knows nothing of the rules format.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::Marker;

use super::model::{Location, MAX_DESCRIPTOR_DEPTH};
use scalar::{check_collection_tag, resolve};

mod scalar;

/// Deepest nesting of mappings and sequences accepted (a guard against hostile input). Each level
/// of descriptors costs two (its list and its mapping), and the deepest limit adds up to four
/// (`rate_limits`, a limit, `replaces`, an entry): room for [`MAX_DESCRIPTOR_DEPTH`] and a margin.
pub(crate) const MAX_DEPTH: usize = 2 * MAX_DESCRIPTOR_DEPTH + 8;

/// What a scalar resolves to (plain scalars follow the YAML 1.2 core schema, quoted and block
/// scalars are always strings, `!!str` forces a string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarKind {
    Str,
    Int,
    Float,
    Bool(bool),
    Null,
}

/// A YAML node and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub location: Location,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// Entries in document order; keys are scalars and unique (duplicates are reported and dropped).
    Map(Vec<(Node, Node)>),
    Seq(Vec<Node>),
    /// The scalar's text as written (after YAML unescaping) and its resolved kind.
    Scalar(String, ScalarKind),
}

impl Node {
    /// "a mapping", "a list", "a string", … for messages.
    pub fn describe(&self) -> &'static str {
        match &self.kind {
            NodeKind::Map(_) => "a mapping",
            NodeKind::Seq(_) => "a list",
            NodeKind::Scalar(_, ScalarKind::Str) => "a string",
            NodeKind::Scalar(_, ScalarKind::Int) => "an integer",
            NodeKind::Scalar(_, ScalarKind::Float) => "a float",
            NodeKind::Scalar(_, ScalarKind::Bool(_)) => "a boolean",
            NodeKind::Scalar(_, ScalarKind::Null) => "null",
        }
    }
}

/// A YAML-level problem at a position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    pub location: Location,
    pub message: String,
}

/// The result of reading one YAML text: the root node (`None` when the stream is empty or a fatal
/// error stopped the parse) and every YAML-level error found.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub root: Option<Node>,
    pub errors: Vec<YamlError>,
}

/// Parses `text` as a single YAML document.
pub fn parse(text: &str) -> Document {
    // A UTF-8 byte-order mark (some Windows editors write one) is not part of the content.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut builder = Builder {
        lines: LineIndex::new(text),
        ..Builder::default()
    };
    let mut parser = Parser::new_from_str(text);
    let fatal = loop {
        match parser.next_token() {
            Ok((Event::StreamEnd, _)) => break None,
            Ok((ev, mark)) => {
                if let Err(e) = builder.event(ev, mark) {
                    break Some(e);
                }
            }
            Err(e) => {
                break Some(YamlError {
                    location: builder.lines.at(e.marker()),
                    message: format!("YAML syntax error: {}", e.info()),
                });
            }
        }
    };
    let mut errors = builder.errors;
    match fatal {
        Some(e) => {
            errors.push(e);
            Document { root: None, errors }
        }
        None => Document {
            root: builder.root,
            errors,
        },
    }
}

/// Where each line of the text starts, to place a parser mark as an editor would: lines end at
/// `\n` only (YAML also breaks lines at a lone `\r`, which editors show inside a line), and a mark
/// past the end of the text (an error at the end of a file without a final newline) is placed at
/// the end of the last line, so every location names a line and column that exist.
#[derive(Debug, Default)]
struct LineIndex {
    /// Character index of the first character of each line after the first.
    starts: Vec<usize>,
    /// Characters in the text.
    len: usize,
}

impl LineIndex {
    fn new(text: &str) -> LineIndex {
        let mut starts = Vec::new();
        let mut len = 0;
        for (i, c) in text.chars().enumerate() {
            if c == '\n' {
                starts.push(i + 1);
            }
            len = i + 1;
        }
        LineIndex { starts, len }
    }

    /// The 1-based line and column of the character at `m.index()`.
    fn at(&self, m: &Marker) -> Location {
        let index = m.index().min(self.len);
        let line = self.starts.partition_point(|&s| s <= index);
        let start = if line == 0 { 0 } else { self.starts[line - 1] };
        Location {
            line: line + 1,
            column: index - start + 1,
        }
    }
}

enum Frame {
    Map {
        start: Marker,
        /// Whether the mapping has an anchor (reported once its location is known).
        anchored: bool,
        /// Index and location of the first key: a block mapping's start mark lies after its first
        /// key, so the mapping's location is whichever comes first.
        first_key: Option<(usize, Location)>,
        entries: Vec<(Node, Node)>,
        pending_key: Option<Node>,
        seen: HashMap<(ScalarKind, String), usize>,
    },
    Seq {
        start: Marker,
        anchored: bool,
        items: Vec<Node>,
    },
}

impl Frame {
    fn map(start: Marker, anchored: bool) -> Frame {
        Frame::Map {
            start,
            anchored,
            first_key: None,
            entries: Vec::new(),
            pending_key: None,
            seen: HashMap::new(),
        }
    }

    fn seq(start: Marker, anchored: bool) -> Frame {
        Frame::Seq {
            start,
            anchored,
            items: Vec::new(),
        }
    }

    /// The finished collection as a node, and whether it had an anchor.
    fn into_node(self, lines: &LineIndex) -> (Node, bool) {
        match self {
            Frame::Seq {
                start,
                anchored,
                items,
            } => {
                let location = lines.at(&start);
                let kind = NodeKind::Seq(items);
                (Node { kind, location }, anchored)
            }
            Frame::Map {
                start,
                anchored,
                first_key,
                entries,
                ..
            } => {
                let location = match first_key {
                    Some((index, location)) if index < start.index() => location,
                    _ => lines.at(&start),
                };
                let kind = NodeKind::Map(entries);
                (Node { kind, location }, anchored)
            }
        }
    }
}

#[derive(Default)]
struct Builder {
    lines: LineIndex,
    stack: Vec<Frame>,
    root: Option<Node>,
    documents: usize,
    errors: Vec<YamlError>,
}

impl Builder {
    /// Takes the parser's next event into the tree; an error stops the parse.
    fn event(&mut self, ev: Event, mark: Marker) -> Result<(), YamlError> {
        match ev {
            Event::DocumentStart => self.document_start(&mark),
            Event::Alias(_) => Err(self.fatal(
                &mark,
                "YAML aliases (*name) are not supported in rules files",
            )),
            Event::Scalar(text, style, anchor, tag) => {
                let kind = resolve(&text, style, tag.as_ref()).map_err(|m| self.fatal(&mark, m))?;
                self.scalar(text, kind, anchor != 0, &mark);
                Ok(())
            }
            Event::SequenceStart(anchor, tag) => {
                check_collection_tag(tag.as_ref(), "seq", self.lines.at(&mark))?;
                self.open(Frame::seq(mark, anchor != 0), &mark)
            }
            Event::MappingStart(anchor, tag) => {
                check_collection_tag(tag.as_ref(), "map", self.lines.at(&mark))?;
                self.open(Frame::map(mark, anchor != 0), &mark)
            }
            Event::SequenceEnd | Event::MappingEnd => self.close(&mark),
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => Ok(()),
        }
    }

    fn fatal(&self, mark: &Marker, message: impl Into<String>) -> YamlError {
        YamlError {
            location: self.lines.at(mark),
            message: message.into(),
        }
    }

    /// Counts documents: a rules file holds one.
    fn document_start(&mut self, mark: &Marker) -> Result<(), YamlError> {
        self.documents += 1;
        if self.documents > 1 {
            return Err(self.fatal(
                mark,
                "a rules file must hold exactly one YAML document (one domain per file); \
                 found a second '---' document",
            ));
        }
        Ok(())
    }

    fn scalar(&mut self, text: String, kind: ScalarKind, anchored: bool, mark: &Marker) {
        let location = self.lines.at(mark);
        if anchored {
            self.errors.push(anchor_error(location.clone()));
        }
        let kind = NodeKind::Scalar(text, kind);
        self.push(Node { kind, location }, mark.index());
    }

    /// Ends the innermost collection and adds it to its parent.
    fn close(&mut self, mark: &Marker) -> Result<(), YamlError> {
        let Some(frame) = self.stack.pop() else {
            return Err(self.fatal(mark, "unbalanced YAML collection end"));
        };
        let (node, anchored) = frame.into_node(&self.lines);
        if anchored {
            self.errors.push(anchor_error(node.location.clone()));
        }
        self.push(node, 0);
        Ok(())
    }

    fn open(&mut self, frame: Frame, mark: &Marker) -> Result<(), YamlError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(YamlError {
                location: self.lines.at(mark),
                message: format!("YAML nested deeper than {MAX_DEPTH} levels"),
            });
        }
        if let Some(Frame::Map {
            pending_key: None, ..
        }) = self.stack.last()
        {
            return Err(YamlError {
                location: self.lines.at(mark),
                message: "a mapping key must be a plain value, not a mapping or a list".into(),
            });
        }
        self.stack.push(frame);
        Ok(())
    }

    /// Adds a finished node to the enclosing collection (or makes it the root). `index` is the
    /// node's char offset, used when it is a mapping's first key.
    fn push(&mut self, mut node: Node, index: usize) {
        let errors = &mut self.errors;
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map {
                first_key,
                entries,
                pending_key,
                seen,
                ..
            }) => match pending_key.take() {
                None => {
                    // Only scalars reach here as keys (`open` rejects collections).
                    first_key.get_or_insert((index, node.location.clone()));
                    *pending_key = Some(node);
                }
                Some(key) => {
                    // `key:` with nothing after it: the parser marks the empty value on a later
                    // line; point at the key instead.
                    if matches!(&node.kind, NodeKind::Scalar(t, ScalarKind::Null) if t.is_empty()) {
                        node.location = key.location.clone();
                    }
                    let NodeKind::Scalar(text, kind) = &key.kind else {
                        return;
                    };
                    let id = (*kind, text.clone());
                    if let Some(&first) = seen.get(&id) {
                        errors.push(YamlError {
                            location: key.location.clone(),
                            message: format!(
                                "duplicate key '{text}' in a mapping (first defined at line {first}, \
                                 again at line {})",
                                key.location.line
                            ),
                        });
                    } else {
                        seen.insert(id, key.location.line);
                        entries.push((key, node));
                    }
                }
            },
        }
    }
}

fn anchor_error(location: Location) -> YamlError {
    YamlError {
        location,
        message: "YAML anchors (&name) are not supported in rules files".into(),
    }
}

#[cfg(test)]
mod tests;
