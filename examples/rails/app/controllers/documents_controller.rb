# Active Storage upload through a multipart form (CSRF-checked). Answers JSON
# so that a client can check what was stored.
class DocumentsController < ApplicationController
  def new
    @document = Document.new
  end

  # POST /documents
  def create
    document = Document.create!(file: params.expect(document: [ :file ])[:file])
    blob = document.file.blob
    render status: :created, json: {
      id: document.id, byte_size: blob.byte_size, checksum: blob.checksum,
      stored_bytes: File.size(ActiveStorage::Blob.service.path_for(blob.key))
    }
  end

  # DELETE /documents/1
  def destroy
    document = Document.find(params.expect(:id))
    document.file.purge
    document.destroy!
    head :no_content
  end
end
