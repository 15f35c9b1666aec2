//! The Chakra execution-trace schema (`et_def.proto`, package `ChakraProtoMsg`, MLCommons
//! Chakra) as prost messages, written with prost's derive macros so no `protoc` is needed at
//! build time. Field numbers and enum values follow the public schema; only the messages and
//! attribute value kinds this exporter writes or reads are declared (a decoder skips the
//! others as unknown fields, as protobuf requires).

/// A named attribute of a node or of the trace (`AttributeProto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// Attribute name (`comm_type`, `comm_size`, `pg_name`, `is_cpu_op`, ...).
    #[prost(string, tag = "1")]
    pub name: String,
    /// Free-form documentation.
    #[prost(string, tag = "2")]
    pub doc_string: String,
    /// The value (`oneof value`).
    #[prost(oneof = "attribute_proto::Value", tags = "3, 7, 9, 13, 27, 29, 14")]
    pub value: Option<attribute_proto::Value>,
}

/// The `oneof value` of [`AttributeProto`].
pub mod attribute_proto {
    /// One attribute value (the kinds this exporter uses).
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        /// `double double_val = 3`.
        #[prost(double, tag = "3")]
        DoubleVal(f64),
        /// `int32 int32_val = 7`.
        #[prost(int32, tag = "7")]
        Int32Val(i32),
        /// `int64 int64_val = 9`.
        #[prost(int64, tag = "9")]
        Int64Val(i64),
        /// `uint64 uint64_val = 13`.
        #[prost(uint64, tag = "13")]
        Uint64Val(u64),
        /// `Uint64List uint64_list = 14`.
        #[prost(message, tag = "14")]
        Uint64List(super::Uint64List),
        /// `bool bool_val = 27`.
        #[prost(bool, tag = "27")]
        BoolVal(bool),
        /// `string string_val = 29`.
        #[prost(string, tag = "29")]
        StringVal(String),
    }
}

/// `message Uint64List { repeated uint64 values = 1; }`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Uint64List {
    /// The values.
    #[prost(uint64, repeated, tag = "1")]
    pub values: Vec<u64>,
}

/// The first record of every trace file (`GlobalMetadata`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GlobalMetadata {
    /// Schema version string.
    #[prost(string, tag = "1")]
    pub version: String,
    /// Trace-wide attributes.
    #[prost(message, repeated, tag = "2")]
    pub attr: Vec<AttributeProto>,
}

/// `enum NodeType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NodeType {
    /// `INVALID_NODE = 0`.
    InvalidNode = 0,
    /// `METADATA_NODE = 1`.
    MetadataNode = 1,
    /// `MEM_LOAD_NODE = 2`.
    MemLoadNode = 2,
    /// `MEM_STORE_NODE = 3`.
    MemStoreNode = 3,
    /// `COMP_NODE = 4`.
    CompNode = 4,
    /// `COMM_SEND_NODE = 5`.
    CommSendNode = 5,
    /// `COMM_RECV_NODE = 6`.
    CommRecvNode = 6,
    /// `COMM_COLL_NODE = 7`.
    CommCollNode = 7,
}

/// `enum CollectiveCommType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum CollectiveCommType {
    /// `ALL_REDUCE = 0`.
    AllReduce = 0,
    /// `REDUCE = 1`.
    Reduce = 1,
    /// `ALL_GATHER = 2`.
    AllGather = 2,
    /// `GATHER = 3`.
    Gather = 3,
    /// `SCATTER = 4`.
    Scatter = 4,
    /// `BROADCAST = 5`.
    Broadcast = 5,
    /// `ALL_TO_ALL = 6`.
    AllToAll = 6,
    /// `REDUCE_SCATTER = 7`.
    ReduceScatter = 7,
    /// `REDUCE_SCATTER_BLOCK = 8`.
    ReduceScatterBlock = 8,
    /// `BARRIER = 9`.
    Barrier = 9,
}

/// `message IOInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IoInfo {
    /// Values.
    #[prost(string, tag = "1")]
    pub values: String,
    /// Shapes.
    #[prost(string, tag = "2")]
    pub shapes: String,
    /// Types.
    #[prost(string, tag = "3")]
    pub types: String,
}

/// One node of the execution graph (`message Node`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    /// Node id, unique within the rank's trace.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// [`NodeType`] value.
    #[prost(enumeration = "NodeType", tag = "3")]
    pub r#type: i32,
    /// Control dependencies (node ids).
    #[prost(uint64, repeated, tag = "4")]
    pub ctrl_deps: Vec<u64>,
    /// Data dependencies (node ids).
    #[prost(uint64, repeated, tag = "5")]
    pub data_deps: Vec<u64>,
    /// Start time, microseconds.
    #[prost(uint64, tag = "6")]
    pub start_time_micros: u64,
    /// Duration, microseconds.
    #[prost(uint64, tag = "7")]
    pub duration_micros: u64,
    /// Inputs.
    #[prost(message, optional, tag = "8")]
    pub inputs: Option<IoInfo>,
    /// Outputs.
    #[prost(message, optional, tag = "9")]
    pub outputs: Option<IoInfo>,
    /// Attributes.
    #[prost(message, repeated, tag = "10")]
    pub attr: Vec<AttributeProto>,
}

impl AttributeProto {
    /// An attribute named `name` holding `value`.
    pub fn new(name: &str, value: attribute_proto::Value) -> Self {
        Self {
            name: name.to_string(),
            doc_string: String::new(),
            value: Some(value),
        }
    }
}

impl Node {
    /// The attribute called `name`, if any.
    pub fn attr(&self, name: &str) -> Option<&attribute_proto::Value> {
        self.attr.iter().find(|a| a.name == name)?.value.as_ref()
    }
}
