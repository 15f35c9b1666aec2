//! Chakra `.et` files: a sequence of length-delimited protobuf records (each a varint length,
//! then the message, as Chakra's `encodeMessage` / `decodeMessage` write them), the
//! [`GlobalMetadata`] first and then one [`Node`] per record.

use crate::ExportError;
use crate::et_def::{GlobalMetadata, Node};
use prost::Message;
use std::path::Path;

/// Encodes a trace: the metadata record, then every node.
pub fn encode_trace(metadata: &GlobalMetadata, nodes: &[Node]) -> Vec<u8> {
    let mut out = Vec::new();
    metadata
        .encode_length_delimited(&mut out)
        .unwrap_or_else(|_| unreachable!("a Vec grows as needed"));
    for n in nodes {
        n.encode_length_delimited(&mut out)
            .unwrap_or_else(|_| unreachable!("a Vec grows as needed"));
    }
    out
}

/// Decodes a trace written by [`encode_trace`] (or by Chakra's own tools).
pub fn decode_trace(
    mut bytes: &[u8],
    file: &str,
) -> Result<(GlobalMetadata, Vec<Node>), ExportError> {
    let bad = |what: &str, e: prost::DecodeError| ExportError::Decode {
        file: file.to_string(),
        message: format!("{what}: {e}"),
    };
    let metadata = GlobalMetadata::decode_length_delimited(&mut bytes)
        .map_err(|e| bad("the GlobalMetadata record", e))?;
    let mut nodes = Vec::new();
    while !bytes.is_empty() {
        let n = Node::decode_length_delimited(&mut bytes)
            .map_err(|e| bad(&format!("node record {}", nodes.len()), e))?;
        nodes.push(n);
    }
    Ok((metadata, nodes))
}

/// Reads and decodes one `.et` file.
pub fn read_trace(path: &Path) -> Result<(GlobalMetadata, Vec<Node>), ExportError> {
    let bytes = std::fs::read(path).map_err(|e| ExportError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    decode_trace(&bytes, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::et_def::attribute_proto::Value;
    use crate::et_def::{AttributeProto, NodeType};

    #[test]
    fn a_trace_decodes_to_what_was_encoded() {
        let meta = GlobalMetadata {
            version: "0.0.4".into(),
            attr: vec![AttributeProto::new("rank", Value::Uint64Val(3))],
        };
        let nodes = vec![
            Node {
                id: 0,
                name: "fwd".into(),
                r#type: NodeType::CompNode as i32,
                duration_micros: 17,
                ..Node::default()
            },
            Node {
                id: 1,
                name: "ag".into(),
                r#type: NodeType::CommCollNode as i32,
                data_deps: vec![0],
                attr: vec![
                    AttributeProto::new("comm_type", Value::Int64Val(2)),
                    AttributeProto::new("comm_size", Value::Int64Val(1 << 20)),
                    AttributeProto::new("pg_name", Value::StringVal("1".into())),
                ],
                ..Node::default()
            },
        ];
        let bytes = encode_trace(&meta, &nodes);
        assert_eq!(decode_trace(&bytes, "t.et").unwrap(), (meta, nodes));
        let err = decode_trace(&bytes[..bytes.len() - 3], "t.et")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("t.et: not a Chakra execution trace: node record 1"),
            "{err}"
        );
    }
}
