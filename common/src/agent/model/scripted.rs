//! placeholder
pub struct ScriptedModel;
impl super::ModelClient for ScriptedModel {
    async fn complete(&self, _r: super::ModelRequest) -> Result<super::ModelResponse, super::ModelError> { Err(super::ModelError::Scenario("x".into())) }
    async fn stream(&self, _r: super::ModelRequest) -> Result<futures::stream::BoxStream<'static, Result<super::ModelChunk, super::ModelError>>, super::ModelError> { Err(super::ModelError::Scenario("x".into())) }
}
